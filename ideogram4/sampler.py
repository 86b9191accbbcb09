"""Asymmetric dual-branch CFG Euler sampler (the official Ideogram 4 sampling loop).

Per step i (sampling order, noise -> clean) with guidance gw_i from the preset:

    out_c = cond_model(x, sigma_i, context, attention_mask)     # text + image tokens
    out_u = uncond_model(x, sigma_i, None)                      # image tokens only
    out   = gw_i * out_c + (1 - gw_i) * out_u                   # = -(gw v_c + (1-gw) v_u)
    x     = x + (sigma_{i+1} - sigma_i) * out

Models use ComfyUI's convention (input sigma, output -velocity), so the same loop drives this
pack's ``Ideogram4DiT`` or ComfyUI's native diffusion model. Steps with gw == 1 skip the
unconditional pass, as the official pipeline does.

Noise convention (the ComfyUI nodes must reproduce it exactly — use ``make_noise``):
    generator = torch.Generator("cpu").manual_seed(seed)
    noise = torch.randn((batch, 128, height // 16, width // 16), generator=generator,
                        dtype=torch.float32, device="cpu")          # then moved to the device
    x_0 = sigmas[0] * noise
This is what ComfyUI's RandomNoise + ``CONST.noise_scaling`` give for an empty Flux2 latent of
that size, so a seed means the same image here and in a native ComfyUI graph. (The official
``ideogram4`` package draws its noise in token layout on the GPU and starts from the unscaled
noise: 1 - sigmas[0] ~ 1.2e-4, so its first step differs by that factor.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from .schedule import Preset, get_preset

LATENT_CHANNELS = 128
LATENT_DOWNSCALE = 16


def latent_shape(width: int, height: int, batch: int = 1, channels: int = LATENT_CHANNELS) -> tuple[int, ...]:
    """[batch, channels, height / 16, width / 16]; width and height must be multiples of 16."""
    if width % LATENT_DOWNSCALE or height % LATENT_DOWNSCALE or width <= 0 or height <= 0:
        raise ValueError(f"width and height must be positive multiples of {LATENT_DOWNSCALE}; got {width}x{height}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1; got {batch}")
    return (int(batch), int(channels), height // LATENT_DOWNSCALE, width // LATENT_DOWNSCALE)


def make_noise(
    seed: int,
    width: int,
    height: int,
    batch: int = 1,
    channels: int = LATENT_CHANNELS,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Seeded standard-normal noise, float32 [batch, channels, H/16, W/16] (see the module docstring)."""
    shape = latent_shape(width, height, batch, channels)
    g = torch.Generator("cpu").manual_seed(int(seed))
    noise = torch.randn(shape, generator=g, dtype=torch.float32, device="cpu")
    return noise.to(device) if device is not None else noise


def initial_latent(noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """x_0 = sigmas[0] * noise (ComfyUI's flow noise scaling of an empty latent)."""
    return noise.float() * float(sigmas[0])


@dataclasses.dataclass
class StepInfo:
    """Passed to the per-step callback after step ``step`` (0-based) of ``total``."""

    step: int
    total: int
    sigma: float
    sigma_next: float
    guidance: float
    x: torch.Tensor  # latent after the step
    denoised: torch.Tensor  # x0 prediction at this step (for previews)


Model = Callable[..., torch.Tensor]


def sample(
    cond_model: Model,
    uncond_model: Model | None,
    context: torch.Tensor,
    *,
    width: int,
    height: int,
    preset: str | Preset = "Default 20",
    seed: int = 0,
    noise: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    sigmas: torch.Tensor | None = None,
    guidance: Sequence[float] | None = None,
    callback: Callable[[StepInfo], None] | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Run the official asymmetric-CFG Euler loop; returns the final latent (float32).

    Args:
        cond_model / uncond_model: ComfyUI-convention models (``model(x, sigma, context=...,
            attention_mask=...) -> -v``); ``uncond_model=None`` reuses ``cond_model`` image-only.
        context: text features [B, L, 53248] for the conditional branch.
        width, height: image size in pixels (multiples of 16).
        preset: a name from ``PRESETS`` or a ``Preset``; gives steps, guidance, mu, std.
        seed / noise: the noise (``make_noise(seed, ...)`` unless ``noise`` is given).
        sigmas / guidance: override the preset's schedule (len steps + 1) / per-step guidance.
        callback: ``callback(StepInfo)`` after every step; raise from it to interrupt.
        device: where the latent lives (default: the context's device).
    """
    p = get_preset(preset)
    device = torch.device(device) if device is not None else context.device
    sig = (sigmas if sigmas is not None else p.sigmas(width, height)).to(torch.float32)
    steps = sig.numel() - 1
    gws = [float(g) for g in (guidance if guidance is not None else p.guidance)]
    if len(gws) != steps:
        raise ValueError(f"sample: {len(gws)} guidance values for {steps} steps")
    batch = context.shape[0]
    if noise is None:
        noise = make_noise(seed, width, height, batch, device=device)
    elif tuple(noise.shape) != latent_shape(width, height, batch, noise.shape[1]):
        raise ValueError(f"sample: noise is {list(noise.shape)}, expected {list(latent_shape(width, height, batch))}")
    x = initial_latent(noise.to(device), sig)
    uncond = uncond_model if uncond_model is not None else cond_model
    for i in range(steps):
        s, s_next, gw = float(sig[i]), float(sig[i + 1]), gws[i]
        sigma_b = torch.full((batch,), s, dtype=torch.float32, device=device)
        out = cond_model(x, sigma_b, context=context, attention_mask=attention_mask).float()
        if gw != 1.0:
            out_u = uncond(x, sigma_b, context=None).float()
            out = gw * out + (1.0 - gw) * out_u
        denoised = x - out * s
        x = x + (s_next - s) * out
        if callback is not None:
            callback(StepInfo(i, steps, s, s_next, gw, x, denoised))
    return x


__all__ = ["sample", "make_noise", "initial_latent", "latent_shape", "StepInfo", "LATENT_CHANNELS"]
