"""The ComfyUI-free side of the demo workflow (``ideogram4.demo_model``): the embedded model's branches, the stand-in
text features and the VAE-free decode with its "RANDOM WEIGHTS" banner."""

from __future__ import annotations

import os

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import demo_model, read_branch
from comfyui_ideogram4_int8.ideogram4.demo import MODEL_SEEDS
from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, write_w8a8


@pytest.mark.parametrize("branch", demo_model.BRANCHES)
def test_branch_state_is_what_the_reader_gives_for_the_cli_demos_file(tmp_path, branch):
    cfg = demo_model.config()
    weights = {b: RandomWeights(cfg, s).materialize() for b, s in MODEL_SEEDS.items()}
    path = write_w8a8(tmp_path / "demo.safetensors", weights, cfg)
    want = read_branch(path, branch, dtype=torch.float32)
    got = demo_model.branch_state(branch, torch.float32)
    assert got.config == cfg and sorted(got) == sorted(want)
    for key, t in want.items():
        assert got[key].dtype == t.dtype, key
        torch.testing.assert_close(got[key], t, rtol=0, atol=0, msg=key)
    assert got.quantized_layers() == want.quantized_layers() and len(got.quantized_layers()) > 20


def test_the_two_branches_differ_and_an_unknown_branch_is_refused():
    cond, uncond = (demo_model.branch_state(b) for b in demo_model.BRANCHES)
    assert not torch.equal(cond["layers.0.attention.qkv.weight"], uncond["layers.0.attention.qkv.weight"])
    with pytest.raises(ValueError, match="branch='negative'"):
        demo_model.branch_state("negative")


def test_text_features_are_deterministic_per_prompt_and_differ_between_prompts():
    cfg = demo_model.config()
    a = demo_model.text_features("A red fox, in snow.")
    assert a.shape == (1, 7, cfg.llm_features_dim) and a.dtype == torch.float32
    torch.testing.assert_close(a, demo_model.text_features("a RED fox, in snow."), rtol=0, atol=0)
    b = demo_model.text_features("A red fox in snow")
    assert b.shape[1] == 5 and not torch.equal(a[:, :3], demo_model.text_features("fox red A,")[:, :3])
    assert 0.8 < float(a.std()) < 1.2  # the scale the demo model's text path was built for (randn context)
    assert demo_model.text_features("").shape == (1, 1, cfg.llm_features_dim)
    long = demo_model.text_features(" ".join(f"w{i}" for i in range(200)))
    assert long.shape[1] == demo_model.MAX_TOKENS


def test_decode_gives_images_of_16_pixels_per_latent_cell_with_the_banner_on_top():
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(3), "little"))
    latent = torch.randn(2, 128, 16, 12, generator=g)
    images = demo_model.decode(latent)
    assert images.shape == (2, 256, 192, 3) and images.dtype == torch.float32
    assert 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    body = images[:, 60:]
    assert float(body.std()) > 0.1  # the latent's colours, not one value
    banner = images[:, :30]
    assert float((banner > 0.9).float().mean()) > 0.02  # white text ...
    assert float((banner < 0.1).float().mean()) > 0.5  # ... on a dark strip
    plain = demo_model.decode(latent, banner="")
    assert float((plain[:, :30] < 0.1).float().mean()) < 0.5 and torch.equal(plain[:, 60:], body)


@pytest.mark.parametrize(
    ("shape", "expect"), [((1, 64, 16, 16), "64 channels"), ((128, 16, 16), "got shape \\(128, 16, 16\\)")]
)
def test_decode_refuses_latents_of_another_model(shape, expect):
    with pytest.raises(ValueError, match=expect):
        demo_model.decode(torch.randn(*shape))
