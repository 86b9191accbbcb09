"""Arguments of the Ideogram 4 sampler node, checked and resolved without ComfyUI.

* ``check_size`` / ``size_problem``: width / height multiples of 16 in [256, 2048], aspect ratio at
  most 6:1 (the official pipeline's limits), the side at fault named, or both sides for the aspect ratio.
* ``plan_sampling``: a preset name (or "custom" + steps, guidance, polish steps / guidance, mu,
  std) -> the sigmas (``schedule.sigmas``, identical to ComfyUI's ``Ideogram4Scheduler``) and one
  guidance value per step, polish steps last, exactly as ``sampler.sample`` runs them.
* ``check_text_features``: the positive conditioning must be Ideogram 4 text features
  [B, L, 53248] (the Qwen3-VL taps ComfyUI's ``CLIPLoader`` type ``ideogram4`` produces).
Errors are ``SamplingArgumentError`` (a ValueError) naming the input and what to change.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from .errors import public_error
from .schedule import DEFAULT_PRESET, PRESETS, Preset, get_preset

MIN_SIZE = 256
MAX_SIZE = 2048
SIZE_MULTIPLE = 16
MAX_ASPECT = 6.0
DEFAULT_SIZE = 1024
CUSTOM = "custom"
PRESET_CHOICES = (*PRESETS, CUSTOM)
TEXT_FEATURES = 53248
MAX_STEPS = 200
MAX_BATCH = 16
FIX_CONDITIONING = "connect CLIPTextEncode with a CLIPLoader of type ideogram4 (Qwen3-VL 8B text encoder)"


@public_error
class SamplingArgumentError(ValueError):
    """A sampler input is out of range; the message names the input and the fix."""


def _side_problem(name: str, v) -> str | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        return f"{name}={v!r} must be an integer number of pixels"
    if v < MIN_SIZE or v > MAX_SIZE:
        return f"{name}={v} is out of range: use {MIN_SIZE}..{MAX_SIZE} pixels"
    if v % SIZE_MULTIPLE:
        lo = int(v) // SIZE_MULTIPLE * SIZE_MULTIPLE
        return (
            f"{name}={v} is not a multiple of {SIZE_MULTIPLE} (the latent is 1/16 of the image): use "
            f"{max(lo, MIN_SIZE)} or {lo + SIZE_MULTIPLE}"
        )
    return None


def size_problem(width, height) -> str | None:
    """What is wrong with an image size, naming the side at fault; None when it is fine.

    A side that is None (a linked input, unknown before the run) is skipped; the aspect ratio is
    checked only when both are known."""
    for name, v in (("width", width), ("height", height)):
        if v is not None:
            problem = _side_problem(name, v)
            if problem:
                return problem
    if width is None or height is None:
        return None
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT:
        big, small = ("width", "height") if width > height else ("height", "width")
        return (
            f"width={width} and height={height} make an aspect ratio of {ratio:.2f}:1; Ideogram 4 supports at "
            f"most {MAX_ASPECT:g}:1 — make the {big} smaller or the {small} larger"
        )
    return None


def check_size(width: int, height: int) -> None:
    """Raise SamplingArgumentError unless width/height are valid Ideogram 4 image sizes."""
    problem = size_problem(width, height)
    if problem:
        raise SamplingArgumentError(problem)


def check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH:
        raise SamplingArgumentError(f"batch_size={batch_size!r} is out of range: use 1..{MAX_BATCH} images per run")


@dataclasses.dataclass(frozen=True)
class SamplingPlan(Preset):
    """What one sampler run does: the preset's steps, per-step ``guidance`` (sampling order), mu and std, and the
    ``sigmas`` [steps + 1] they give for the image size."""

    sigmas: torch.Tensor


def plan_sampling(
    preset: str,
    width: int,
    height: int,
    *,
    steps: int | None = None,
    guidance: float | None = None,
    polish_steps: int | None = None,
    polish_guidance: float | None = None,
    mu: float | None = None,
    std: float | None = None,
) -> SamplingPlan:
    """Resolve a preset (or ``"custom"`` with the other arguments) for an image of width x height.

    Named presets ignore the custom arguments (they are the official values); "custom" takes each
    missing one from the default preset (Default 20).
    """
    check_size(width, height)
    if preset == CUSTOM:
        base = PRESETS[DEFAULT_PRESET]
        n = int(steps if steps is not None else base.steps)
        g_main = float(guidance if guidance is not None else base.guidance[0])
        n_polish = int(polish_steps if polish_steps is not None else base.guidance.count(base.guidance[-1]))
        g_polish = float(polish_guidance if polish_guidance is not None else base.guidance[-1])
        mu_v = float(mu if mu is not None else base.mu)
        std_v = float(std if std is not None else base.std)
        if not 1 <= n <= MAX_STEPS:
            raise SamplingArgumentError(f"steps={n} is out of range: use 1..{MAX_STEPS}")
        if n_polish < 0:
            raise SamplingArgumentError(f"polish_steps={n_polish} is negative: use 0..steps ({n})")
        if n_polish > n:
            raise SamplingArgumentError(
                f"polish_steps={n_polish} is more than steps={n} (the polish steps are the "
                "last steps of the run): lower polish_steps or raise steps"
            )
        for name, v in (("guidance", g_main), ("polish_guidance", g_polish), ("mu", mu_v)):
            if not math.isfinite(v):
                raise SamplingArgumentError(f"{name}={v} must be a finite number")
        for name, v in (("guidance", g_main), ("polish_guidance", g_polish)):
            if v < 0:
                raise SamplingArgumentError(f"{name}={v:g} is negative: use 0 or more (official: 7 and 3)")
        if not (math.isfinite(std_v) and std_v > 0):
            raise SamplingArgumentError(f"std={std_v} must be > 0 (the spread of the logit-normal schedule)")
        p = Preset.main_then_polish(CUSTOM, n, n_polish, mu_v, std_v, g_main, g_polish)
    else:
        try:
            p = get_preset(preset)
        except ValueError:
            raise SamplingArgumentError(f"preset={preset!r} is unknown; choose one of {list(PRESET_CHOICES)}") from None
    return SamplingPlan(p.name, p.steps, tuple(float(g) for g in p.guidance), p.mu, p.std, p.sigmas(width, height))


def check_text_features(
    shape: Sequence[int], expected_features: int = TEXT_FEATURES, *, input_name: str = "positive"
) -> None:
    """The conditioning tensor must be [B, L, expected_features] with L >= 1."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or shape[2] != expected_features or shape[1] < 1 or shape[0] < 1:
        raise SamplingArgumentError(
            f"{input_name} conditioning is {list(shape)}, but this Ideogram 4 model needs text features "
            f"[batch, tokens, {expected_features}]: {FIX_CONDITIONING}"
        )


__all__ = [
    "SamplingArgumentError",
    "SamplingPlan",
    "check_size",
    "size_problem",
    "check_batch_size",
    "plan_sampling",
    "check_text_features",
    "PRESET_CHOICES",
    "CUSTOM",
    "MIN_SIZE",
    "MAX_SIZE",
    "SIZE_MULTIPLE",
    "MAX_ASPECT",
    "DEFAULT_SIZE",
    "TEXT_FEATURES",
    "FIX_CONDITIONING",
    "MAX_STEPS",
    "MAX_BATCH",
]
