"""Shared helpers for kernel tests (CPU interpreter and GPU)."""

from __future__ import annotations

import torch
from comfyui_ideogram4_int8 import kernels as K

# Ideogram 4 linear shapes (N, K) and token counts (M).
IDEOGRAM_SHAPES = {
    "qkv": (13824, 4608),
    "o": (4608, 4608),
    "w1": (12288, 4608),
    "w2": (4608, 12288),
    "adaln_modulation": (18432, 512),
    "llm_cond_proj": (4608, 53248),
    "input_proj": (4608, 128),
}
M_COND, M_UNCOND, M_TEXT = 4608, 4096, 512


def activations(m, k, gen, dtype=torch.float32, device="cpu", outliers=True):
    """Random activations with a few outlier channels (as DiT activations have)."""
    x = torch.randn(m, k, generator=gen) * 0.5
    if outliers and k >= 8:
        idx = torch.randperm(k, generator=gen)[: max(1, k // 64)]
        x[:, idx] *= 40.0
    return x.to(device=device, dtype=dtype)


def int8(shape, gen, device="cpu"):
    return torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8).to(device)


def weight(n, k, gen, device="cpu", outliers=True):
    """A quantized weight with per-channel scales; some channels carry much larger scales."""
    w = int8((n, k), gen, device)
    scale = torch.rand(n, generator=gen) * 0.02 + 1e-3
    if outliers:
        scale[torch.randperm(n, generator=gen)[: max(1, n // 50)]] *= 30.0
    return w, scale.to(device)


def reference_f64(q, s, w, w_scale, bias=None):
    """float64 result of the same quantized operands."""
    y = (q.double() @ w.double().t()) * s.double()[:, None] * w_scale.double()[None, :]
    if bias is not None:
        y = y + bias.double()[None, :]
    return y


def rel_err(y, ref):
    y, ref = y.double(), ref.double()
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def cosine(y, ref):
    y, ref = y.double().flatten(), ref.double().flatten()
    return (y @ ref / (y.norm() * ref.norm()).clamp_min(1e-30)).item()


def launches(name):
    return K.REGISTRY.launches[name]
