"""Name the format of a checkpoint from its header (for logs, the loader node and errors)."""

from __future__ import annotations

import os

import torch

from ..safetensors_io import Header
from .source import BRANCHES, MODEL_PREFIXES, split_branches

LINEAR_ROOTS = ("layers.", "input_proj", "llm_cond_proj", "t_embedding", "adaln_proj", "final_layer")


def detect_format(path: str | os.PathLike) -> dict:
    """Header-only summary: {"layout", "branches", "format", "linears": {kind: count}}.

    ``format`` is one of: transformerlab-w8a8, comfy-int8-convrot, comfy-int8, comfy-fp8,
    comfy-fp8-legacy, float-bf16 / float-float16 / float-float32, unknown.
    """
    header = Header(path)
    groups = split_branches(header.keys())
    branches = [b for b in BRANCHES if groups[b]]
    keys = list(header.keys())
    kinds = {"wq": 0, "int8": 0, "fp8": 0, "float": 0}
    float_dtypes = set()
    for k in keys:
        local = k
        for b in BRANCHES:
            if local.startswith(b + "."):
                local = local[len(b) + 1 :]
        for p in MODEL_PREFIXES:
            if local.startswith(p):
                local = local[len(p) :]
        dt, shape = header.entries[k]
        if local.endswith(".wq"):
            kinds["wq"] += 1
        elif local.endswith(".weight") and len(shape) == 2 and local.startswith(LINEAR_ROOTS):
            if dt == torch.int8:
                kinds["int8"] += 1
            elif dt in (torch.float8_e4m3fn, torch.float8_e5m2):
                kinds["fp8"] += 1
            else:
                kinds["float"] += 1
                float_dtypes.add(str(dt).replace("torch.", ""))
    convrot = False
    if kinds["int8"]:
        from ..safetensors_io import open_safetensors
        from .comfy_quant import decode_comfy_quant

        with open_safetensors(path) as f:
            for k in keys:
                if k.endswith(".comfy_quant"):
                    try:
                        convrot = convrot or decode_comfy_quant(f.get_tensor(k))["convrot"]
                    except ValueError:
                        pass
    if kinds["wq"]:
        fmt = "transformerlab-w8a8"
    elif kinds["int8"]:
        fmt = "comfy-int8-convrot" if convrot else "comfy-int8"
    elif kinds["fp8"]:
        fmt = "comfy-fp8-legacy" if "scaled_fp8" in header else "comfy-fp8"
    elif kinds["float"]:
        fmt = "float-" + "/".join(sorted(float_dtypes))
    else:
        fmt = "unknown"
    return {
        "layout": "two-branch" if branches else "single",
        "branches": branches,
        "format": fmt,
        "linears": {k: v for k, v in kinds.items() if v},
    }
