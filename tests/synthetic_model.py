"""A tiny synthetic W8A8 checkpoint in the transformerlab layout, and a runner that sends every one
of its linears through the real kernels so the GEMM registry holds what really ran.

Used by the panel tests (CI) and by the test-only ComfyUI node in ``tests/comfyui_nodes/``.
Until the loader / sampler nodes land, this stands in for "load a model and sample": the file is
read back tensor by tensor with ``safe_open``; each quantized linear runs through
``kernels.w8a8_linear`` (site ``"<branch>/<module>"``) and each protected one through
``kernels.float_linear`` (path ``bf16``). To switch the tests to the real loader, replace
:func:`run_checkpoint` by "loader node builds the model, sampler runs N steps"; the assertions
only read the registry / report.

Layout (DESIGN.md §2, format 1): ``<branch>.<module>.wq`` int8 [N, K], ``.ws`` float32 [N],
optional ``.smooth`` [K] and ``.bias`` [N]; protected linears as ``<branch>.<module>.weight`` bf16.
Module names follow the native Ideogram 4 model (``layers.<i>.attention.qkv`` ...), at toy sizes.
"""

from __future__ import annotations

import pathlib

import torch
from safetensors import safe_open
from safetensors.torch import save_file

try:  # the package name differs between a pip install and ComfyUI's custom-node loader
    from comfyui_ideogram4_int8 import kernels
    from comfyui_ideogram4_int8.kernels.reference import quantize_weight_ref
except ImportError:  # pragma: no cover - inside ComfyUI the pack may be loaded under its folder name
    import importlib
    import sys

    _pack = next(m for n, m in sys.modules.items() if n.endswith("ideogram4_int8") and hasattr(m, "comfy_entrypoint"))
    kernels = importlib.import_module(f"{_pack.__name__}.kernels")
    quantize_weight_ref = importlib.import_module(f"{_pack.__name__}.kernels.reference").quantize_weight_ref

BRANCHES = ("conditional", "unconditional")
# toy sizes, every N and K a multiple of 8 (so cuBLAS INT8 is possible on CUDA too)
DIM, FF, ADA, TXT, IN, BLOCKS = 64, 128, 32, 96, 16, 2
PROTECTED = ("feed_forward.w2",)  # the real checkpoint keeps FFN down-projections in bf16


def linear_shapes(branch: str) -> dict[str, tuple[int, int]]:
    """module -> (N, K) of every linear of one branch, in native module order."""
    shapes: dict[str, tuple[int, int]] = {}
    if branch == "conditional":
        shapes["llm_cond_proj"] = (DIM, TXT)  # the unconditional branch sees no text
    shapes["input_proj"] = (DIM, IN)
    for i in range(BLOCKS):
        p = f"layers.{i}."
        shapes[p + "attention.qkv"] = (3 * DIM, DIM)
        shapes[p + "attention.o"] = (DIM, DIM)
        shapes[p + "feed_forward.w1"] = (FF, DIM)
        shapes[p + "feed_forward.w3"] = (FF, DIM)
        shapes[p + "feed_forward.w2"] = (DIM, FF)
        shapes[p + "adaln_modulation"] = (6 * DIM, ADA)
    shapes["final_layer.linear"] = (IN, DIM)
    return shapes


def is_protected(module: str) -> bool:
    return module.endswith(PROTECTED)


def write_checkpoint(path: str | pathlib.Path, seed: int) -> pathlib.Path:
    """Write both branches as one W8A8 safetensors file; weights drawn fresh from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for branch in BRANCHES:
        for module, (n, k) in linear_shapes(branch).items():
            key = f"{branch}.{module}"
            w = torch.randn(n, k, generator=g) / k**0.5
            bias = torch.randn(n, generator=g) * 0.1
            if is_protected(module):
                tensors[key + ".weight"] = w.to(torch.bfloat16)
                tensors[key + ".bias"] = bias.to(torch.bfloat16)
                continue
            smooth = (torch.rand(k, generator=g) + 0.5) if module.endswith("qkv") else None
            wq, ws = quantize_weight_ref(w, smooth)
            tensors[key + ".wq"], tensors[key + ".ws"], tensors[key + ".bias"] = wq, ws, bias
            if smooth is not None:
                tensors[key + ".smooth"] = smooth
    path = pathlib.Path(path)
    save_file(tensors, str(path))
    return path


def read_branch_linears(path: str | pathlib.Path, branch: str) -> dict[str, dict[str, torch.Tensor]]:
    """module -> its tensors ({"wq","ws","smooth"?,"bias"?} or {"weight","bias"?}), read lazily."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    prefix = branch + "."
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            if not key.startswith(prefix):
                continue
            module, field = key[len(prefix) :].rsplit(".", 1)
            out.setdefault(module, {})[field] = f.get_tensor(key)
    return out


def run_checkpoint(
    path: str | pathlib.Path,
    branches=BRANCHES,
    label_suffix: str = "",
    steps: int = 2,
    tokens: int = 8,
    path_override: str | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> dict[str, dict[str, str]]:
    """Run every linear of ``branches`` ``steps`` times; returns {label: {module: expected kind}}.

    ``path_override`` forces a GEMM path through the ``path`` argument (strict); None leaves the
    choice to dispatch (and to IDEOGRAM4_INT8_GEMM_PATH). Labels are ``branch + label_suffix``.
    ``device``: where the weights and activations live (``"cuda"`` on a GPU machine).
    """
    g = torch.Generator().manual_seed(seed)
    ran: dict[str, dict[str, str]] = {}
    for branch in branches:
        label = branch + label_suffix
        linears = {
            module: {name: t.to(device) for name, t in fields.items()}
            for module, fields in read_branch_linears(path, branch).items()
        }
        ran[label] = {}
        for _ in range(steps):
            for module, t in linears.items():
                k = (t["wq"] if "wq" in t else t["weight"]).shape[1]
                m = 1 if module.endswith("adaln_modulation") else tokens
                x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
                site = f"{label}/{module}"
                if "wq" in t:
                    kernels.w8a8_linear(
                        x, t["wq"], t["ws"], bias=t.get("bias"), smooth=t.get("smooth"), path=path_override, site=site
                    )
                    ran[label][module] = "quantized"
                else:
                    kernels.float_linear(
                        x, t["weight"], t.get("bias"), site=site, reason="protected layer (stored in bf16)"
                    )
                    ran[label][module] = "protected"
    return ran
