"""Reference DiT: native key names, conventions, RoPE / packing math, W8A8-vs-float fidelity."""

from __future__ import annotations

import math

import pytest
import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4 import rope
from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT, timestep_embedding
from comfyui_ideogram4_int8.ideogram4.synthetic import write_w8a8
from comfyui_ideogram4_int8.ideogram4.w8a8_module import W8A8Linear, dequant_linears, float_linears, w8a8_linears
from ideogram4_checks import TINY, cosine, inputs, linear_io, rel_err, tiny_weights, worst_layer_vs_float

# ComfyUI's native Ideogram 4 state dict (the keys of ComfyUI 0.33's comfy/ldm/ideogram4), written out by hand
TOP = {
    "input_proj.weight": (4608, 128),
    "input_proj.bias": (4608,),
    "llm_cond_norm.weight": (53248,),
    "llm_cond_proj.weight": (4608, 53248),
    "llm_cond_proj.bias": (4608,),
    "t_embedding.mlp_in.weight": (4608, 4608),
    "t_embedding.mlp_in.bias": (4608,),
    "t_embedding.mlp_out.weight": (4608, 4608),
    "t_embedding.mlp_out.bias": (4608,),
    "adaln_proj.weight": (512, 4608),
    "adaln_proj.bias": (512,),
    "embed_image_indicator.weight": (2, 4608),
    "final_layer.linear.weight": (128, 4608),
    "final_layer.linear.bias": (128,),
    "final_layer.adaln_modulation.weight": (4608, 512),
    "final_layer.adaln_modulation.bias": (4608,),
}
BLOCK = {
    "attention.qkv.weight": (13824, 4608),
    "attention.norm_q.weight": (256,),
    "attention.norm_k.weight": (256,),
    "attention.o.weight": (4608, 4608),
    "feed_forward.w1.weight": (12288, 4608),
    "feed_forward.w3.weight": (12288, 4608),
    "feed_forward.w2.weight": (4608, 12288),
    "attention_norm1.weight": (4608,),
    "attention_norm2.weight": (4608,),
    "ffn_norm1.weight": (4608,),
    "ffn_norm2.weight": (4608,),
    "adaln_modulation.weight": (18432, 512),
    "adaln_modulation.bias": (18432,),
}


def test_full_config_has_the_native_keys_and_shapes():
    shapes = Ideogram4Config.full().float_shapes()
    want = dict(TOP)
    for i in range(34):
        want.update({f"layers.{i}.{k}": v for k, v in BLOCK.items()})
    assert len(want) == 458 and shapes == want
    assert Ideogram4Config.full().linear_parameter_count() == 9_277_931_520


def test_module_tree_state_dict_keys_are_native(gen):
    model = Ideogram4DiT(TINY, state_dict=tiny_weights(gen)["conditional"])
    names = {k.replace("layers.1.", "layers.0.") for k in model.state_dict()}
    assert names == set(TOP) | {f"layers.0.{k}" for k in BLOCK}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == TINY.float_shapes()


def test_load_state_dict_into_an_empty_model_matches(gen):
    w = tiny_weights(gen)["conditional"]
    built = Ideogram4DiT(TINY, state_dict=w)
    shell = Ideogram4DiT(TINY)
    shell.load_state_dict(w, strict=True)
    x, ctx, sigma = inputs(gen)
    with torch.no_grad():
        assert torch.equal(built(x, sigma, context=ctx), shell(x, sigma, context=ctx))


def test_rope_matches_complex_rotation(gen):
    d, theta, sections = 64, 5e6, (10, 8, 9)
    pos = torch.cat([rope.text_position_ids(5), rope.image_position_ids(3, 4)])
    x = torch.randn(2, pos.shape[0], 3, d, generator=gen)
    cos, sin = rope.rope_cos_sin(pos, d, theta, sections)
    got = rope.apply_rope(x, cos, sin)
    half = d // 2
    inv = (1.0 / (theta ** (torch.arange(0, d, 2).float() / d))).float()
    for i in range(half):
        axis = 1 if (i % 3 == 1 and i < 3 * sections[1]) else 2 if (i % 3 == 2 and i < 3 * sections[2]) else 0
        angle = (pos[:, axis].float() * inv[i]).double()  # the angle is formed in float32 (as natively)
        z = (
            torch.complex(x[..., i].double(), x[..., i + half].double())
            * torch.polar(torch.ones_like(angle), angle)[None, :, None]
        )
        torch.testing.assert_close(got[..., i].double(), z.real, atol=2e-6, rtol=0)
        torch.testing.assert_close(got[..., i + half].double(), z.imag, atol=2e-6, rtol=0)


def test_positions():
    img = rope.image_position_ids(2, 3)
    off = rope.IMAGE_POSITION_OFFSET
    assert img.tolist() == [[off, off + r, off + c] for r in range(2) for c in range(3)]
    assert rope.text_position_ids(3).tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]


def test_token_packing_channel_order(gen):
    model = Ideogram4DiT(TINY)
    x = torch.randn(2, TINY.in_channels, 3, 5, generator=gen)
    tok = model.latent_to_tokens(x)
    ae = TINY.ae_channels
    for b, h, w, pi, pj, c in [(0, 0, 0, 0, 1, 2), (1, 2, 4, 1, 0, 3), (1, 1, 3, 1, 1, 0)]:
        # latent channel order (c, pi, pj); token feature order (pi, pj, c)
        assert tok[b, h * 5 + w, (pi * 2 + pj) * ae + c] == x[b, c * 4 + pi * 2 + pj, h, w]
    assert torch.equal(model.tokens_to_latent(tok, 3, 5), x)


def test_timestep_embedding_formula(gen):
    t = torch.rand(3, generator=gen)
    dim = 32
    got = timestep_embedding(t, dim).double()
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64)
    args = 1e4 * t.double()[:, None] * torch.exp(-math.log(1e4) * i / (half - 1))[None, :]
    torch.testing.assert_close(got, torch.cat([args.sin(), args.cos()], dim=1), atol=5e-3, rtol=0)


def test_forward_is_negated_velocity_at_one_minus_sigma(gen):
    model = Ideogram4DiT(TINY, state_dict=tiny_weights(gen)["conditional"])
    x, ctx, sigma = inputs(gen)
    with torch.no_grad():
        assert torch.equal(model(x, sigma, context=ctx), -model.velocity(x, 1.0 - sigma, ctx))
        assert torch.equal(model(x, sigma), -model.velocity(x, 1.0 - sigma))
        one = model(x[:1], float(sigma[0]), context=ctx[:1])  # a scalar timestep is broadcast
        assert torch.equal(one, model(x[:1], sigma[:1], context=ctx[:1]))


def test_masked_text_tokens_do_not_reach_the_image(gen):
    model = Ideogram4DiT(TINY, state_dict=tiny_weights(gen)["conditional"])
    x, ctx, sigma = inputs(gen, n_text=6)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 3:] = 0
    mask[1, 5:] = 0
    other = ctx.clone()
    other[0, 3:] = torch.randn(3, TINY.llm_features_dim, generator=gen) * 10
    other[1, 5:] = -other[1, 5:]
    with torch.no_grad():
        a = model(x, sigma, context=ctx, attention_mask=mask)
        b = model(x, sigma, context=other, attention_mask=mask)
        c = model(x, sigma, context=other)
    assert torch.equal(a, b), "padded text rows changed the image output"
    assert not torch.allclose(a, c), "without the mask the padded rows take part"


def test_image_only_branch_never_runs_the_text_projection(gen, tmp_path):
    path = write_w8a8(tmp_path / "w.safetensors", tiny_weights(gen), TINY)
    model = Ideogram4DiT.from_state_dict(
        read_branch(path, "unconditional", dtype=torch.float32), w8a8_linears(), label="uncond-only"
    )
    x, ctx, sigma = inputs(gen)
    kernels.REGISTRY.clear("uncond-only")
    with torch.no_grad():
        model(x, sigma)
    sites = {r.layer for r in kernels.REGISTRY.layers("uncond-only")}
    assert "llm_cond_proj" not in sites and "layers.1.attention.qkv" in sites
    with torch.no_grad():
        model(x, sigma, context=ctx)
    assert "llm_cond_proj" in {r.layer for r in kernels.REGISTRY.layers("uncond-only")}


def _activation_outlier_ratio(model, x, sigma, ctx):
    """max / median of the per-channel absmax of the qkv input (what SmoothQuant is for)."""
    qkv_in, _ = linear_io(model, x, sigma, ctx)["layers.0.attention.qkv"]
    amax = qkv_in.abs().flatten(0, -2).amax(dim=0)
    return (amax.max() / amax.median()).item()


def _assert_layers_match_phantom(w8, dq, x, sigma, context, where):
    """Each W8A8 layer of ``w8`` against the same layer of ``dq`` (phantom path) on the input it was given: the same
    int8 codes and scales, so only float32 roundings differ (the exact int32 product times two scales, against a K-term
    float32 dot product of the dequantized operands): within (K + 8) u (|q s|.|w ws|^T + |b|) element by element."""
    twins = dq.linear_modules()
    seen = {n: io for n, io in linear_io(w8, x, sigma, context).items() if isinstance(twins[n], W8A8Linear)}
    assert "layers.0.attention.qkv" in seen and (context is None) == ("llm_cond_proj" not in seen), where
    for name, (xin, a) in seen.items():
        twin = twins[name]
        with torch.no_grad():
            d = twin(xin)
        k = twin.in_features
        q, s = kernels.quantize_per_token_ref(xin.reshape(-1, k), twin.input_divisor)
        wd = twin.weight.double() * twin.weight_scale.double()[:, None]
        size = (q.double().abs() * s.double()[:, None]) @ wd.abs().T
        if twin.bias is not None:
            size = size + twin.bias.double().abs()
        err = (a.double().reshape(size.shape) - d.double().reshape(size.shape)).abs()
        tol = (k + 8) * 2.0**-24 * size
        assert (err <= tol).all(), f"{where} {name}: {(err / tol).max().item():.3g}x the float32 bound"


@pytest.mark.parametrize("smooth", ["auto", None])
def test_w8a8_dit_matches_float_dit_with_outliers(gen, tmp_path, smooth):
    weights = tiny_weights(gen, outlier_gain=24.0)
    path = write_w8a8(tmp_path / "w.safetensors", weights, TINY, smooth=smooth)
    x, ctx, sigma = inputs(gen)
    for branch, c in (("conditional", ctx), ("unconditional", None)):
        ref = Ideogram4DiT(TINY, float_linears(), state_dict=weights[branch])
        sd = read_branch(path, branch, dtype=torch.float32)
        w8 = Ideogram4DiT.from_state_dict(sd, w8a8_linears(), label=branch)
        dq = Ideogram4DiT.from_state_dict(read_branch(path, branch, dtype=torch.float32), dequant_linears())
        # max / median channel absmax of the qkv input: 9.5-28+ over 300 draws with outlier_gain 24 (7.0 seen once in
        # CI, the old bound 8 failed it); 1.6-4.4 over 80 draws without outlier channels (outlier_gain 1)
        ratio = _activation_outlier_ratio(ref, x, sigma, c)
        assert ratio > 5.0, f"seed {gen.initial_seed()} {branch}: the test model lost its outlier channels ({ratio})"
        with torch.no_grad():
            r, a, d = ref(x, sigma, context=c), w8(x, sigma, context=c), dq(x, sigma, context=c)
        # each layer on its own input: 1.9% median, 3.8% worst over 2000 draws
        worst, layer = worst_layer_vs_float(w8, ref, x, sigma, c)
        assert worst < 0.08, f"seed {gen.initial_seed()} {branch} {layer}: {worst}"
        # end to end the tiny random DiT amplifies those errors by a factor that varies a lot with the draw (a one-row
        # adaln_modulation can set it: cos 0.987 once in 6800 draws, 0.997 the next lowest), hence only loosely
        assert cosine(a, r) >= 0.9, f"seed {gen.initial_seed()} {branch}: {cosine(a, r)}"
        _assert_layers_match_phantom(w8, dq, x, sigma, c, f"seed {gen.initial_seed()} {branch}")
        # end to end the two differ by float roundings plus the activation-rounding flips those cause downstream: one
        # flip in a one-row layer (t_embedding, adaln) moves every token. 1e-5x without flips, 0.31x seen with them
        # (2400 draws); closer than W8A8 is to float is what stays true with a wide margin
        assert rel_err(a, d) < rel_err(a, r), f"seed {gen.initial_seed()} {branch}"
        paths = {rec.layer: rec.path for rec in kernels.REGISTRY.layers(branch)}
        assert paths["layers.0.attention.qkv"] == kernels.PATH_CUBLAS  # CPU: labelled fallback
        assert paths["layers.1.feed_forward.w2"] == kernels.PATH_BF16  # protected


def test_forced_triton_path_on_the_interpreter_is_bit_identical(gen, tmp_path):
    """The fused kernel (Triton interpreter on CPU) gives the same bits as the cuBLAS-path twin."""
    path = write_w8a8(tmp_path / "w.safetensors", tiny_weights(gen), TINY)
    sd = read_branch(path, "conditional", dtype=torch.float32)
    fused = Ideogram4DiT.from_state_dict(
        dict(sd), w8a8_linears(path=kernels.PATH_TRITON), config=TINY, label="forced-triton"
    )
    twin = Ideogram4DiT.from_state_dict(dict(sd), w8a8_linears(path=kernels.PATH_CUBLAS), config=TINY)
    x, ctx, sigma = inputs(gen, batch=1, gh=3, gw=4, n_text=3)
    with torch.no_grad():
        a, b = fused(x, sigma, context=ctx), twin(x, sigma, context=ctx)
    assert torch.equal(a, b)
    assert kernels.REGISTRY.counts("forced-triton")[kernels.PATH_TRITON] >= 5 * TINY.num_layers


def test_declare_paths_lists_layers_before_they_run(gen, tmp_path):
    path = write_w8a8(tmp_path / "w.safetensors", tiny_weights(gen), TINY)
    model = Ideogram4DiT.from_state_dict(
        read_branch(path, "conditional"), w8a8_linears(), label="declared", dtype=torch.bfloat16
    )
    kernels.REGISTRY.clear("declared")
    model.declare_paths()
    recs = {r.layer: r for r in kernels.REGISTRY.layers("declared")}
    assert set(recs) == set(TINY.linear_names()) and all(r.calls == 0 for r in recs.values())
    assert "protected" in recs["layers.1.feed_forward.w2"].reason
    model.set_label("renamed")
    assert model.layers[0].attention.qkv.site == "renamed/layers.0.attention.qkv"


def test_w8a8_module_keeps_float32_scales_under_dtype_casts(gen):
    w = torch.randn(24, 40, generator=gen)
    mod = W8A8Linear.from_float(w, torch.randn(24, generator=gen), torch.rand(40, generator=gen) + 0.5)
    before = {k: v.clone() for k, v in mod.state_dict().items()}
    mod.to(torch.bfloat16)
    after = mod.state_dict()
    for k in before:
        assert after[k].dtype == before[k].dtype and torch.equal(after[k], before[k]), k
    x = torch.randn(5, 40, generator=gen)
    ref = x.double() @ w.double().T + before["bias"].double()
    assert cosine(mod(x), ref) > 0.999


@pytest.mark.parametrize("path", [kernels.PATH_TRITON, kernels.PATH_CUBLAS])
def test_fused_gate_up_matches_separate_projections(gen, tmp_path, path):
    """w1|w3 as one GEMM with SwiGLU in the epilogue computes the same model as two GEMMs: against the
    float model it is at least as close (it skips two bf16/fp32 roundings of gate and up)."""
    weights = tiny_weights(gen, outlier_gain=24.0)
    file = write_w8a8(tmp_path / "w.safetensors", weights, TINY, smooth=None)
    sd = read_branch(file, "conditional", dtype=torch.float32)
    ref = Ideogram4DiT(TINY, float_linears(), state_dict=weights["conditional"])
    split = Ideogram4DiT.from_state_dict(dict(sd), w8a8_linears(path=path), config=TINY, label="split")
    fused = Ideogram4DiT.from_state_dict(dict(sd), w8a8_linears(path=path), config=TINY, label="fused")
    assert fused.fuse_gate_up() == TINY.num_layers
    assert fused.layers[0].feed_forward.w1 is None  # the fused module took over both weights
    x, ctx, sigma = inputs(gen, batch=1, gh=3, gw=4, n_text=3)
    with torch.no_grad():
        r, a, b = ref(x, sigma, context=ctx), split(x, sigma, context=ctx), fused(x, sigma, context=ctx)
    assert cosine(b, r) >= 0.99
    assert rel_err(b, a) < 0.2 * rel_err(a, r) + 1e-6, f"seed {gen.initial_seed()}"
    sites = {rec.layer: rec.path for rec in kernels.REGISTRY.layers("fused")}
    assert sites["layers.0.feed_forward.w1|w3"] == path


def test_gate_up_with_different_smoothing_fuses_only_after_a_shared_fold(gen, tmp_path):
    weights = tiny_weights(gen)
    file = write_w8a8(tmp_path / "w.safetensors", weights, TINY, smooth="auto")
    sd = read_branch(file, "conditional", dtype=torch.float32)
    assert not torch.equal(sd["layers.0.feed_forward.w1.input_smooth"], sd["layers.0.feed_forward.w3.input_smooth"])
    # unfolded, or folded with w3 dividing by its ratio to w1's vector: w1 and w3 quantize different activations
    for kwargs in ({"fold_smooth": False}, {"gate_up": "ratio"}):
        model = Ideogram4DiT.from_state_dict(sd, w8a8_linears(), config=TINY, **kwargs)
        assert model.fuse_gate_up() == 0, kwargs
        assert model.layers[0].feed_forward.w1 is not None
    # one shared vector folded into ffn_norm1 (the default): the same activation, one fused GEMM
    model = Ideogram4DiT.from_state_dict(sd, w8a8_linears(), config=TINY)
    assert model.fuse_gate_up() == TINY.num_layers
    assert model.layers[0].feed_forward.gate_up.input_smooth is None  # and its quantizer does not divide
