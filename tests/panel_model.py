"""Load and sample real Ideogram 4 W8A8 models (ComfyUI-free, fast on a CPU) for the GEMM-path panel tests.

``load_and_run`` is the pack's model side end to end on a tiny synthetic checkpoint, so the registry holds what a
real load + sampler run leaves there:

1. ``ideogram4.synthetic.write_w8a8`` writes a two-branch W8A8 file (transformerlab layout) of
   ``Ideogram4Config.tiny()`` with fresh seeded weights — the writer's defaults: every block linear and
   ``llm_cond_proj`` W8A8, ``feed_forward.w2`` of odd blocks protected (bf16), the other top-level linears float;
2. each branch is read back with ``read_branch`` and built as ``Ideogram4DiT`` with ``w8a8_linears()`` labelled
   ``<branch><label_suffix>``; ``declare_paths()`` lists every linear before it runs, as the loader does;
3. ``steps`` denoising calls as the sampler makes them: the conditional branch with text features, the
   unconditional branch image-only (so its ``llm_cond_proj`` never runs).

The returned expectations come from the writer's documented defaults and the architecture, never from the
registry, so the report can be checked against them.
"""

from __future__ import annotations

import dataclasses
import pathlib

import torch
from comfyui_ideogram4_int8.ideogram4 import Ideogram4DiT, read_branch, w8a8_linears
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, default_protected, write_w8a8

CFG = Ideogram4Config.tiny()
BRANCHES = ("conditional", "unconditional")
TEXT_TOKENS = 3  # conditioning tokens of the conditional pass
GRID = (2, 2)  # latent grid in tokens (patches)
FILE = "ideogram4-tiny-w8a8.safetensors"
PER_SAMPLE = ("t_embedding.mlp_in", "t_embedding.mlp_out", "adaln_proj", "final_layer.adaln_modulation")
REASON_PROTECTED = "protected in checkpoint (stored bf16)"  # w8a8_linears' reasons for float layers
REASON_TOP = "unquantized top-level layer"


@dataclasses.dataclass(frozen=True)
class Linear:
    kind: str  # "w8a8", "protected" (bf16 in the file, inside a block) or "top" (float top-level linear)
    n: int
    k: int
    m: int  # rows of each call; 0 when the layer does not run in this branch
    calls: int


def kinds(config: Ideogram4Config = CFG) -> dict[str, str]:
    """What ``write_w8a8``'s defaults store for each linear."""
    protected = set(default_protected(config))
    quantized = set(config.default_quantized()) - protected
    return {
        s.name: "w8a8" if s.name in quantized else "protected" if s.name in protected else "top"
        for s in config.linears()
    }


def write_checkpoint(folder: pathlib.Path, seed: int) -> pathlib.Path:
    path = pathlib.Path(folder) / FILE
    if not path.exists():
        weights = {b: RandomWeights(CFG, seed + i).materialize() for i, b in enumerate(BRANCHES)}
        write_w8a8(path, weights, CFG)
    return path


def expected(branch: str, steps: int) -> dict[str, Linear]:
    """module -> what the report must say about it after ``steps`` calls of one branch."""
    n_img = GRID[0] * GRID[1]
    text = TEXT_TOKENS if branch == "conditional" else 0
    kind_of = kinds()
    out = {}
    for spec in CFG.linears():
        if spec.name in PER_SAMPLE or spec.name.endswith("adaln_modulation"):
            m = 1  # batch 1: one row per sample
        elif spec.name == "llm_cond_proj":
            m = text  # the text features only; the image-only pass never runs it
        else:
            m = text + n_img
        out[spec.name] = Linear(kind_of[spec.name], spec.out_features, spec.in_features, m, steps if m else 0)
    return out


def load_and_run(
    folder,
    seed: int,
    branches=BRANCHES,
    steps: int = 2,
    label_suffix: str = "",
    path: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, dict[str, Linear]]:
    """Load ``branches`` from the tiny checkpoint in ``folder`` (written on first use) and sample ``steps`` steps.

    ``path`` forces a GEMM path on every W8A8 layer (``w8a8_linears(path=...)``, strict); None leaves the choice
    to dispatch and IDEOGRAM4_INT8_GEMM_PATH. Returns {label: expected(branch, steps)}.
    """
    ckpt = write_checkpoint(folder, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, CFG.in_channels, *GRID, generator=g).to(device)
    context = torch.randn(1, TEXT_TOKENS, CFG.llm_features_dim, generator=g).to(device)
    sigmas = torch.linspace(1.0, 0.1, steps)
    ran = {}
    for branch in branches:
        label = branch + label_suffix
        state = read_branch(ckpt, branch, device=device, dtype=dtype)
        model = Ideogram4DiT.from_state_dict(
            state, w8a8_linears(path=path), dtype=dtype, device=device, label=label, consume=True
        )
        model.declare_paths()
        with torch.no_grad():
            for sigma in sigmas:
                model(x, sigma.to(device), context=context if branch == "conditional" else None)
        ran[label] = expected(branch, steps)
    return ran
