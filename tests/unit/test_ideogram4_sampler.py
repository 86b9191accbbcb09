"""Dual-branch CFG Euler sampler: noise convention, guidance order, determinism, callbacks."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
from comfyui_ideogram4_int8.ideogram4.sampler import initial_latent, latent_shape, make_noise, sample
from comfyui_ideogram4_int8.ideogram4.schedule import PRESETS, sigmas
from comfyui_ideogram4_int8.ideogram4.synthetic import write_w8a8
from comfyui_ideogram4_int8.ideogram4.w8a8_module import float_linears, w8a8_linears
from ideogram4_checks import TINY, cosine, seed_of, tiny_weights


def test_noise_is_comfyui_prepare_noise(gen):
    """ComfyUI: generator = torch.manual_seed(seed); randn(latent.size(), float32, cpu)."""
    seed = seed_of(gen)
    with torch.random.fork_rng():
        generator = torch.manual_seed(seed)
        want = torch.randn((2, 128, 40, 24), dtype=torch.float32, generator=generator, device="cpu")
    got = make_noise(seed, 384, 640, batch=2)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert latent_shape(384, 640, 2) == (2, 128, 40, 24)
    with pytest.raises(ValueError):
        latent_shape(1000, 1024)


class ConstModel:
    """-velocity = value everywhere; records its calls."""

    def __init__(self, value):
        self.value, self.calls = value, []

    def __call__(self, x, sigma, context=None, attention_mask=None):
        self.calls.append((sigma.clone(), context))
        return torch.full_like(x, self.value)


@pytest.mark.parametrize("name", list(PRESETS))
def test_guidance_per_step_in_sampling_order(name):
    p = PRESETS[name]
    cond, uncond = ConstModel(2.0), ConstModel(-0.5)
    ctx = torch.zeros(1, 3, 8)
    steps = []
    out = sample(cond, uncond, ctx, width=64, height=32, preset=p, seed=1, callback=lambda info: steps.append(info))
    sig = p.sigmas(64, 32)
    xs = [initial_latent(make_noise(1, 64, 32), sig)] + [s.x for s in steps]
    for i, info in enumerate(steps):
        # x_{i+1} - x_i = (s_{i+1} - s_i) * (gw * 2 + (1 - gw) * -0.5)  ->  recover gw
        d = ((xs[i + 1] - xs[i]) / (sig[i + 1] - sig[i])).mean().item()
        gw = (d + 0.5) / 2.5
        assert gw == pytest.approx(p.guidance[i], abs=1e-3), (name, i)
        assert info.guidance == p.guidance[i] and info.step == i and info.total == p.steps
        assert info.sigma == float(sig[i]) and info.sigma_next == float(sig[i + 1])
    assert [g for g in p.guidance[-3:]][-1] == 3.0 and steps[-1].guidance == 3.0 and steps[0].guidance == 7.0
    assert torch.equal(out, steps[-1].x)
    # cond sees the text, uncond never does; both see every step's sigma
    assert all(c is ctx for _, c in cond.calls) and all(c is None for _, c in uncond.calls)
    assert [float(s[0]) for s, _ in cond.calls] == [float(v) for v in sig[:-1]]


def test_guidance_one_skips_the_unconditional_pass():
    cond, uncond = ConstModel(1.0), ConstModel(5.0)
    sample(cond, uncond, torch.zeros(1, 2, 8), width=32, height=32, preset="Turbo 12", guidance=[1.0] * 11 + [3.0])
    assert len(cond.calls) == 12 and len(uncond.calls) == 1


def test_initial_latent_is_sigma0_times_noise(gen):
    seed = seed_of(gen)
    zero = ConstModel(0.0)
    out = sample(zero, zero, torch.zeros(1, 2, 8), width=48, height=32, preset="Default 20", seed=seed)
    s0 = sigmas(20, 48, 32, 0.0, 1.75)[0]
    assert torch.equal(out, make_noise(seed, 48, 32) * float(s0))


def test_callback_can_interrupt():
    class Stop(Exception):
        pass

    seen = []

    def cb(info):
        seen.append(info.step)
        if info.step == 2:
            raise Stop

    with pytest.raises(Stop):
        sample(ConstModel(1.0), ConstModel(0.0), torch.zeros(1, 2, 8), width=32, height=32, callback=cb)
    assert seen == [0, 1, 2]


@pytest.fixture
def tiny_pair(tmp_path, gen):
    weights = tiny_weights(gen)
    path = write_w8a8(tmp_path / "w.safetensors", weights, TINY)
    w8 = {
        b: Ideogram4DiT.from_state_dict(read_branch(path, b, dtype=torch.float32), w8a8_linears(), label=b)
        for b in weights
    }
    ref = {b: Ideogram4DiT(TINY, float_linears(), state_dict=w) for b, w in weights.items()}
    ctx = torch.randn(1, 4, TINY.llm_features_dim, generator=gen)
    return w8, ref, ctx


def test_sampling_is_deterministic_per_seed_and_close_to_float(tiny_pair, gen):
    w8, ref, ctx = tiny_pair
    seed = seed_of(gen)

    def run(models, s):
        noise = make_noise(s, 64, 96, channels=TINY.in_channels)
        with torch.no_grad():
            return sample(
                models["conditional"], models["unconditional"], ctx, width=64, height=96, preset="Turbo 12", noise=noise
            )

    a, b = run(w8, seed), run(w8, seed)
    assert torch.equal(a, b), "same seed, different latent"
    assert not torch.allclose(a, run(w8, seed + 1)), "the seed does not reach the latent"
    assert cosine(a, run(ref, seed)) >= 0.99
