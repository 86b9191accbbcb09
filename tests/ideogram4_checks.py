"""Shared helpers for the ideogram4 tests: tiny weights, files, float64 references."""

from __future__ import annotations

import torch
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights
from safetensors.torch import load_file

TINY = Ideogram4Config.tiny()


def seed_of(gen: torch.Generator) -> int:
    return int(torch.randint(0, 2**31 - 1, (1,), generator=gen))


def tiny_weights(gen, cfg: Ideogram4Config = TINY, **kw) -> dict[str, dict[str, torch.Tensor]]:
    """Fresh random float32 weights for both branches (different seeds per test)."""
    return {b: RandomWeights(cfg, seed_of(gen), **kw).materialize() for b in ("conditional", "unconditional")}


def raw(path) -> dict[str, torch.Tensor]:
    """The file's tensors exactly as stored (safetensors' own reader, not ours)."""
    return load_file(str(path))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def inputs(gen, cfg: Ideogram4Config = TINY, batch=2, gh=4, gw=6, n_text=5):
    x = torch.randn(batch, cfg.in_channels, gh, gw, generator=gen)
    ctx = torch.randn(batch, n_text, cfg.llm_features_dim, generator=gen)
    sigma = torch.rand(batch, generator=gen) * 0.9 + 0.05
    return x, ctx, sigma


def linear_io(model, x, sigma, context=None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (input, output)} of every linear of ``model`` in one forward: what each layer was given and gave."""
    seen = {}

    def keep(name):
        def hook(module, args, out):
            seen.setdefault(name, (args[0].detach(), out.detach()))

        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in model.linear_modules().items()]
    try:
        with torch.no_grad():
            model(x, sigma, context=context)
    finally:
        for h in hooks:
            h.remove()
    return seen


def worst_layer_vs_float(model, ref, x, sigma, context=None) -> tuple[float, str]:
    """The largest rel err of a linear of ``model``, on the input the model gave it, against ``ref``'s layer (the
    original float weights) on the same input, and that layer's name. Per layer, quantization error does not compound
    through the network, whose amplification of it varies a lot from draw to draw (a tiny random DiT). A fold into a
    producer's output scales (attention.o's or w2's vector) would show up here as an error: none of the callers' files
    smooth those."""
    floats, mods = ref.linear_modules(), model.linear_modules()
    worst = (0.0, "")
    for name, (xin, y) in linear_io(model, x, sigma, context).items():
        folded = getattr(mods[name], "input_folded", None)
        if folded is not None:  # a SmoothQuant vector folded upstream: the input arrives divided by it
            xin = xin * folded
        with torch.no_grad():
            worst = max(worst, (rel_err(y, floats[name](xin)), name))
    return worst


def assert_names(err: BaseException, *parts: str) -> None:
    """The error message names every part (file, key, expected, found ...)."""
    msg = str(err)
    for p in parts:
        assert str(p) in msg, f"{p!r} not in error message: {msg}"
