"""Ideogram 4 sampling schedule and the official presets.

The schedule is logit-normal in the reference time t (0 = noise, 1 = clean): step boundary i of
n sits at the quantile u_i = i / n,

    t(u) = 1 - expit(mean + std * ndtri(u)),   mean = mu + 0.5 * ln(W * H / 512**2),

with t clamped to the logSNR range [-15, 18] (logSNR = 2 * logit(t)). ComfyUI's sigma is 1 - t,
listed from noise to clean; the last sigma is forced to 0 so the last step lands on the data.
All math in float64, returned as float32 — the same values as ComfyUI's ``Ideogram4Scheduler``.

Guidance: ``v = gw * v_cond + (1 - gw) * v_uncond`` with one gw per step. ``Preset.guidance``
is in sampling order (index 0 = the first, noisiest step): the official presets run their
low-guidance "polish" steps last. (The official ``ideogram4`` package stores the same schedule
reversed, indexed by its descending loop counter.)
"""

from __future__ import annotations

import dataclasses
import math

import torch

LOGSNR_MIN = -15.0
LOGSNR_MAX = 18.0
RESOLUTION_BASE = 512 * 512


def schedule_mean(width: int, height: int, mu: float) -> float:
    """The logit-normal mean after the resolution shift."""
    return mu + 0.5 * math.log((width * height) / RESOLUTION_BASE)


def sigmas(steps: int, width: int, height: int, mu: float, std: float) -> torch.Tensor:
    """Descending sigmas, float32 [steps + 1], sigmas[0] ~ 1 (noise) ... sigmas[-1] = 0.

    Args:
        steps: number of Euler steps (>= 1).
        width, height: image size in pixels (the resolution shift uses W*H / 512**2).
        mu: logSNR shift of the preset; std: spread (> 0).
    """
    if int(steps) != steps or steps < 1:
        raise ValueError(f"sigmas: steps must be an integer >= 1; got {steps!r}")
    if width <= 0 or height <= 0:
        raise ValueError(f"sigmas: width and height must be positive; got {width}x{height}")
    if not std > 0:
        raise ValueError(f"sigmas: std must be > 0; got {std!r}")
    mean = schedule_mean(width, height, mu)
    u = torch.linspace(0.0, 1.0, int(steps) + 1, dtype=torch.float64)
    t = 1.0 - torch.special.expit(mean + std * torch.special.ndtri(u))
    # logSNR = 2 * logit(t): t in [expit(LOGSNR_MIN / 2), expit(LOGSNR_MAX / 2)]
    t = t.clamp(1.0 / (1.0 + math.exp(0.5 * LOGSNR_MAX)), 1.0 / (1.0 + math.exp(0.5 * LOGSNR_MIN)))
    out = (1.0 - t).flip(0)
    out[-1] = 0.0
    return out.to(torch.float32)


@dataclasses.dataclass(frozen=True)
class Preset:
    """An official sampling preset: steps, per-step guidance (sampling order), mu, std."""

    name: str
    steps: int
    guidance: tuple[float, ...]
    mu: float
    std: float

    def __post_init__(self) -> None:
        if len(self.guidance) != self.steps:
            raise ValueError(f"Preset {self.name!r}: {len(self.guidance)} guidance values for {self.steps} steps")

    @classmethod
    def main_then_polish(
        cls, name: str, steps: int, polish: int, mu: float, std: float, gw_main: float = 7.0, gw_polish: float = 3.0
    ) -> Preset:
        return cls(name, steps, (gw_main,) * (steps - polish) + (gw_polish,) * polish, mu, std)

    def sigmas(self, width: int, height: int) -> torch.Tensor:
        return sigmas(self.steps, width, height, self.mu, self.std)

    def describe(self) -> str:
        runs = []
        for g in self.guidance:
            if runs and runs[-1][0] == g:
                runs[-1][1] += 1
            else:
                runs.append([g, 1])
        sched = " then ".join(f"{n}x{g:g}" for g, n in runs)
        return f"{self.name}: {self.steps} steps, guidance {sched}, mu {self.mu:g}, std {self.std:g}"


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset.main_then_polish("Quality 48", 48, 3, mu=0.0, std=1.5),
        Preset.main_then_polish("Default 20", 20, 2, mu=0.0, std=1.75),
        Preset.main_then_polish("Turbo 12", 12, 1, mu=0.5, std=1.75),
    )
}
DEFAULT_PRESET = "Default 20"


def get_preset(preset: str | Preset) -> Preset:
    """A preset by name (case- and space-insensitive: 'turbo12', 'Turbo 12') or as given."""
    if isinstance(preset, Preset):
        return preset
    key = str(preset).replace(" ", "").replace("_", "").lower()
    for name, p in PRESETS.items():
        if name.replace(" ", "").lower() == key or name.split()[0].lower() == key:
            return p
    raise ValueError(f"unknown preset {preset!r}; choose one of {list(PRESETS)}")
