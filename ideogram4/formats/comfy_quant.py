"""ComfyUI's per-layer ``<layer>.comfy_quant`` marker: a uint8 tensor holding UTF-8 JSON.

Examples: ``{"format": "float8_e4m3fn"}``, ``{"format": "int8_tensorwise", "convrot": true,
"convrot_groupsize": 256}``. Extra parameters may sit at the top level or under ``"params"``.
"""

from __future__ import annotations

import json

import torch

from ..errors import TensorMismatchError, UnsupportedFormatError

INT8_FORMATS = ("int8_tensorwise",)
FP8_FORMATS = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
DEFAULT_CONVROT_GROUP = 256


def encode_comfy_quant(info: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(info, separators=(",", ":")).encode("utf-8")), dtype=torch.uint8)


def decode_comfy_quant(t: torch.Tensor, *, file=None, key=None) -> dict:
    """Parse the marker; returns {"format", "convrot", "convrot_groupsize", "full_precision_mm", "raw"}."""
    if t.dtype != torch.uint8 or t.dim() != 1:
        raise TensorMismatchError(
            "comfy_quant marker has the wrong form",
            file=file,
            key=key,
            expected="uint8 [n] (UTF-8 JSON)",
            found=f"{t.dtype} {list(t.shape)}",
        )
    try:
        info = json.loads(bytes(t.tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorMismatchError(f"comfy_quant marker is not JSON ({exc})", file=file, key=key) from None
    if not isinstance(info, dict) or "format" not in info:
        raise TensorMismatchError(
            "comfy_quant marker lacks a 'format' field",
            file=file,
            key=key,
            expected='{"format": ...}',
            found=str(info)[:80],
        )
    params = info.get("params") if isinstance(info.get("params"), dict) else {}

    def field(name, default=None):
        return info.get(name, params.get(name, default))

    fmt = str(info["format"])
    if fmt not in INT8_FORMATS and fmt not in FP8_FORMATS:
        raise UnsupportedFormatError(
            f"comfy_quant format {fmt!r} is not supported by this pack",
            file=file,
            key=key,
            expected=f"one of {list(INT8_FORMATS) + list(FP8_FORMATS)}",
            found=fmt,
            fix="use ComfyUI's own loader for this file, or a bf16 / fp8 / int8_tensorwise checkpoint",
        )
    convrot = bool(field("convrot", False))
    group = int(field("convrot_groupsize", DEFAULT_CONVROT_GROUP)) if convrot else None
    return {
        "format": fmt,
        "convrot": convrot,
        "convrot_groupsize": group,
        "full_precision_mm": bool(field("full_precision_matrix_mult", False)),
        "raw": info,
    }
