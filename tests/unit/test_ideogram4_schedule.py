"""Schedule and presets against values computed here independently (stdlib math only)."""

from __future__ import annotations

import math

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4.schedule import PRESETS, get_preset, sigmas


def ndtri(u: float) -> float:
    """Inverse standard-normal CDF by bisection on math.erf (independent of torch / scipy)."""
    if u <= 0.0:
        return -math.inf
    if u >= 1.0:
        return math.inf
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < u:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def expit(z: float) -> float:
    if z == math.inf:
        return 1.0
    if z == -math.inf:
        return 0.0
    return 1.0 / (1.0 + math.exp(-z))


def sigmas_by_hand(steps, width, height, mu, std):
    mean = mu + 0.5 * math.log(width * height / 512**2)
    t_lo = 1.0 / (1.0 + math.exp(9.0))  # logSNR 18 -> t = expit(-9)
    t_hi = 1.0 / (1.0 + math.exp(-7.5))  # logSNR -15
    out = []
    for j in range(steps + 1):
        u = (steps - j) / steps  # descending sigma = ascending reference time reversed
        t = 1.0 - expit(mean + std * ndtri(u))
        out.append(1.0 - min(max(t, t_lo), t_hi))
    out[-1] = 0.0
    return torch.tensor(out, dtype=torch.float64)


SIZES = [(1024, 1024), (768, 1344), (2048, 2048), (512, 512), (1536, 640)]


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("size", SIZES)
def test_preset_sigmas_equal_published_formula(name, size):
    p = PRESETS[name]
    got = sigmas(p.steps, size[0], size[1], p.mu, p.std)
    want = sigmas_by_hand(p.steps, size[0], size[1], p.mu, p.std)
    assert got.dtype == torch.float32 and got.shape == (p.steps + 1,)
    torch.testing.assert_close(got.double(), want, atol=3e-7, rtol=0)


def test_random_parameters_equal_published_formula(gen):
    for _ in range(20):
        steps = int(torch.randint(1, 65, (1,), generator=gen))
        w, h = (int(v) * 16 for v in torch.randint(16, 257, (2,), generator=gen))
        mu = float(torch.empty(1).uniform_(-2, 2, generator=gen))
        std = float(torch.empty(1).uniform_(0.3, 3.0, generator=gen))
        got = sigmas(steps, w, h, mu, std)
        want = sigmas_by_hand(steps, w, h, mu, std)
        torch.testing.assert_close(got.double(), want, atol=3e-7, rtol=0, msg=f"seed {gen.initial_seed()}: {steps=}")


def test_hand_derived_points():
    # 1024x1024: mean = 0.5 ln 4 = ln 2; the middle quantile u = 1/2 gives sigma = expit(ln 2) = 2/3
    s = sigmas(20, 1024, 1024, 0.0, 1.75)
    assert s[10].item() == pytest.approx(2.0 / 3.0, abs=1e-7)
    # first sigma: t clamped at logSNR 18, i.e. t = 1 / (1 + e^9)
    assert s[0].item() == pytest.approx(1.0 - 1.0 / (1.0 + math.exp(9.0)), abs=1e-7)
    assert s[-1].item() == 0.0
    assert bool((s[1:] < s[:-1]).all()), "sigmas must strictly decrease"
    one = sigmas(1, 1024, 1024, 0.0, 1.0)
    assert one.tolist() == pytest.approx([1.0 - 1.0 / (1.0 + math.exp(9.0)), 0.0], abs=1e-7)
    # 512x512: no resolution shift, mu 0 -> the middle sigma is exactly 1/2
    assert sigmas(12, 512, 512, 0.0, 1.75)[6].item() == pytest.approx(0.5, abs=1e-7)


def test_logsnr_clamp_both_ends():
    hi = sigmas(8, 1024, 1024, 40.0, 1.0)  # everything pushed to the noise end
    assert torch.allclose(hi[:-1].double(), torch.full((8,), 1.0 - 1.0 / (1.0 + math.exp(9.0)), dtype=torch.float64))
    lo = sigmas(8, 1024, 1024, -40.0, 1.0)  # everything but u = 1 pushed to the clean end, floor logSNR -15
    assert lo[0].item() == pytest.approx(1.0 - 1.0 / (1.0 + math.exp(9.0)), abs=1e-7)  # u = 1: ndtri = +inf
    assert torch.allclose(lo[1:-1].double(), torch.full((7,), 1.0 / (1.0 + math.exp(7.5)), dtype=torch.float64))
    assert lo[-1].item() == 0.0


def test_presets_are_the_official_table():
    table = {  # name: (steps, main steps at gw 7, polish steps at gw 3, mu, std)
        "Quality 48": (48, 45, 3, 0.0, 1.5),
        "Default 20": (20, 18, 2, 0.0, 1.75),
        "Turbo 12": (12, 11, 1, 0.5, 1.75),
    }
    assert set(PRESETS) == set(table)
    for name, (steps, main, polish, mu, std) in table.items():
        p = PRESETS[name]
        assert (p.steps, p.mu, p.std) == (steps, mu, std)
        # sampling order: the high-guidance steps come first, the polish steps last
        assert list(p.guidance) == [7.0] * main + [3.0] * polish
        assert p.guidance[-1] == 3.0 and p.guidance[0] == 7.0


def test_get_preset_names_and_errors():
    assert get_preset("turbo12") is PRESETS["Turbo 12"]
    assert get_preset("Quality") is PRESETS["Quality 48"]
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("Fast 4")


@pytest.mark.parametrize("args", [(0, 1024, 1024, 0.0, 1.0), (4, 0, 1024, 0.0, 1.0), (4, 1024, 1024, 0.0, 0.0)])
def test_bad_schedule_arguments(args):
    with pytest.raises(ValueError):
        sigmas(*args)
