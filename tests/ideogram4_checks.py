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


def assert_names(err: BaseException, *parts: str) -> None:
    """The error message names every part (file, key, expected, found ...)."""
    msg = str(err)
    for p in parts:
        assert str(p) in msg, f"{p!r} not in error message: {msg}"
