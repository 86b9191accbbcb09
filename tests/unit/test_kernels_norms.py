"""The fused norms on the CPU interpreter: q/k RMSNorm + RoPE, the block's modulated RMSNorms, the pre-norm's
quantized hand-off, and kernels that fail being demoted with their reason."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends
from kernel_checks import activations, int8, launches, rel_err

pytestmark = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None,
    reason="Triton interpreter not available (needs triton + TRITON_INTERPRET=1)",
)


# -- fused q/k RMSNorm + RoPE ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_rope_matches_twin_on_a_strided_qkv_view(dtype, gen):
    b, n, h, d = 2, 7, 3, 64
    qkv = (torch.randn(b, n, 3 * h * d, generator=gen) * 3).to(dtype).view(b, n, 3, h, d)
    q = qkv[:, :, 0]  # strided view, as the model slices it
    w = torch.rand(d, generator=gen) + 0.5
    ang = torch.rand(n, d // 2, generator=gen) * 6
    before = launches("qk_norm_rope_triton")
    out = K.qk_norm_rope(q, w, ang.cos(), ang.sin(), 1e-5)
    assert launches("qk_norm_rope_triton") == before + 1
    ref = K.qk_norm_rope_ref(q, w, ang.cos(), ang.sin(), 1e-5)
    assert out.is_contiguous() and out.dtype == dtype
    assert rel_err(out, ref) <= (1e-6 if dtype == torch.float32 else 8e-3)
    assert rel_err(out, _qk_norm_rope64(q, w, ang, 1e-5)) <= (1e-6 if dtype == torch.float32 else 8e-3)


def _qk_norm_rope64(q, w, ang, eps):
    """The definition in float64: per-head RMSNorm, then pairs (i, i + D/2) rotated by the token's angle."""
    x = q.double()
    y = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w.double()
    c, s = ang.double().cos()[None, :, None], ang.double().sin()[None, :, None]
    h = y.shape[-1] // 2
    return torch.cat((y[..., :h] * c - y[..., h:] * s, y[..., h:] * c + y[..., :h] * s), -1)


def test_a_qk_norm_rope_kernel_that_fails_is_demoted_once_with_its_reason_and_the_twin_runs(gen, monkeypatch):
    """A variant of the q/k norm + RoPE kernel that fails to build or launch never raises: the call returns the
    twin's result, that variant (head size, dtype) is demoted with the error in its reason (the model note reads
    ``qk_rope_demotion``), later calls go straight to the twin without trying the kernel again, and another dtype
    keeps the kernel."""
    from comfyui_ideogram4_int8.kernels import dispatch
    from comfyui_ideogram4_int8.kernels import qk_norm_rope_triton as R

    b, n, h, d = 1, 5, 2, 64
    qkv = (torch.randn(b, n, 3 * h * d, generator=gen) * 3).view(b, n, 3, h, d)
    w = torch.rand(d, generator=gen) + 0.5
    ang = torch.rand(n, d // 2, generator=gen) * 6
    cos, sin = ang.cos(), ang.sin()
    real, tries = R.qk_norm_rope_triton, []

    def fails_in_bf16(x, *args, **kwargs):
        if x.dtype == torch.bfloat16:
            tries.append(x.shape)
            raise RuntimeError("out of resources: shared memory")
        return real(x, *args, **kwargs)

    monkeypatch.setattr(R, "qk_norm_rope_triton", fails_in_bf16)
    backends.DEMOTIONS.clear()
    try:
        q = qkv.bfloat16()[:, :, 0]
        before = launches("qk_norm_rope_triton")
        for _ in range(3):
            got = K.qk_norm_rope(q, w, cos, sin, 1e-5)
            assert torch.equal(got, K.qk_norm_rope_ref(q, w, cos, sin, 1e-5))
            assert rel_err(got, _qk_norm_rope64(q, w, ang, 1e-5)) <= 8e-3
        assert len(tries) == 1, "the failing variant must be tried once, not on every call"
        assert launches("qk_norm_rope_triton") == before
        (demoted,) = backends.DEMOTIONS.items()
        assert demoted["backend"] == "triton" and demoted["shape"] == ["qk_norm_rope", d, "bfloat16"]
        why = dispatch.qk_rope_demotion()
        assert why == demoted["reason"] and why.startswith(dispatch.QK_ROPE_KERNEL + " failed")
        assert "RuntimeError: out of resources: shared memory" in why
        assert dispatch.block_norm_demotion() is None  # each kernel reads only its own demotions
        q32 = qkv[:, :, 0]  # float32: another variant, still the kernel
        assert rel_err(K.qk_norm_rope(q32, w, cos, sin, 1e-5), _qk_norm_rope64(q32, w, ang, 1e-5)) <= 1e-6
        assert launches("qk_norm_rope_triton") == before + 1 and len(tries) == 1
    finally:
        backends.DEMOTIONS.clear()


def test_a_quantizer_kernel_that_fails_is_demoted_once_and_the_linear_runs_on_the_twins_codes(gen, monkeypatch):
    """A variant of the activation quantizer that fails to build or launch never raises out of a linear: the call
    quantizes with the twin (the same codes and scales), that variant (K, dtype, smoothing, group) is demoted with
    the error as its reason and not tried again, and another K keeps the kernel; a rotating (ConvRot) variant the
    same way."""
    from comfyui_ideogram4_int8.kernels import quant_triton as Q

    real_rows, tries = Q.quantize_rows_triton, []

    def fails_at_k300(x, *args, **kwargs):
        if x.shape[1] == 300:
            tries.append("rows")
            raise RuntimeError("PassManager::run failed")
        return real_rows(x, *args, **kwargs)

    def rotating_fails(x, group):
        tries.append("rotated")
        raise RuntimeError("out of resources: registers")

    monkeypatch.setattr(Q, "quantize_rows_triton", fails_at_k300)
    monkeypatch.setattr(Q, "quantize_rotated_rows_triton", rotating_fails)
    backends.DEMOTIONS.clear()
    try:
        x = activations(9, 300, gen)
        for _ in range(3):
            q, s = K.quantize_per_token(x)
            qr, sr = K.quantize_per_token_ref(x)
            assert torch.equal(q, qr) and torch.equal(s, sr)
        assert tries == ["rows"], "the failing variant must be tried once, not on every call"
        (demoted,) = backends.DEMOTIONS.items()
        assert demoted["shape"] == ["quantize", 300, "float32", False, None]
        assert demoted["reason"].startswith("Triton activation quantizer failed (RuntimeError: PassManager")
        before = launches("quant_triton")
        x2 = activations(9, 320, gen)  # another K: the kernel still runs
        assert torch.equal(K.quantize_per_token(x2)[0], K.quantize_per_token_ref(x2)[0])
        assert launches("quant_triton") == before + 1
        xr = activations(5, 512, gen)  # ConvRot's group 256: the rotating kernel fails, the twin rotates
        for _ in range(2):
            q, s = K.quantize_per_token(xr, convrot_group=256)
            qr, sr = K.reference.quantize_rotated_ref(xr, 256)
            assert torch.equal(q, qr) and torch.equal(s, sr)
        assert tries == ["rows", "rotated"]
        assert len(backends.DEMOTIONS.items()) == 2
    finally:
        backends.DEMOTIONS.clear()


def test_a_kernel_call_short_of_memory_raises_and_demotes_nothing(gen, monkeypatch):
    """An out-of-memory error in a Triton kernel's call (its output's allocation, on a full card) says nothing about
    the variant: it reaches the caller as before (ComfyUI's OOM handling), nothing is demoted, and the next call runs
    the kernel again instead of the slower twin for the rest of the process."""
    from comfyui_ideogram4_int8.kernels import quant_triton as Q

    real_rows, tries = Q.quantize_rows_triton, []

    def short_once(x, *args, **kwargs):
        tries.append(x.shape[1])
        if len(tries) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 54.00 MiB")
        return real_rows(x, *args, **kwargs)

    monkeypatch.setattr(Q, "quantize_rows_triton", short_once)
    backends.DEMOTIONS.clear()
    try:
        x = activations(9, 300, gen)
        with pytest.raises(torch.cuda.OutOfMemoryError):
            K.quantize_per_token(x)
        assert backends.DEMOTIONS.items() == []
        before = launches("quant_triton")
        q, s = K.quantize_per_token(x)
        qr, sr = K.quantize_per_token_ref(x)
        assert torch.equal(q, qr) and torch.equal(s, sr)
        assert tries == [300, 300] and launches("quant_triton") == before + 1
    finally:
        backends.DEMOTIONS.clear()


# -- the block's modulated RMSNorms (rms_modulate_triton.py) ------------------------------------------------


def _block_operands(gen, b, n, c, dtype, vec_batch):
    x = (torch.randn(b, n, c, generator=gen) * 2).to(dtype)
    x[..., 3] *= 60  # an outlier channel, as Ideogram 4's residual stream has
    y = (torch.randn(b, n, c, generator=gen) * 5).to(dtype)
    w = (torch.rand(c, generator=gen) + 0.5).to(dtype)
    mod = (torch.randn(vec_batch, 1, 4 * c, generator=gen) * 0.5).to(dtype)
    scale = 1.0 + mod[..., c : 2 * c]  # a chunk of the modulation, as the block takes it (row stride 4C)
    gate = torch.tanh(mod[..., 3 * c :])
    return x, y, w, scale, gate


def _rounded64(t, dtype):
    return t.to(dtype).double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("b", "n", "c", "vec_batch"), [(1, 3, 4608, 1), (2, 5, 100, 2), (2, 4, 72, 1)])
def test_rms_norm_modulate_and_gated_residual_match_float64_and_the_twin(dtype, b, n, c, vec_batch, gen):
    """The fused pre-norm (rms_norm(x) * scale) and residual (x + gate * rms_norm(y)) against float64 with the unfused
    ops' roundings at the same points, and against the twin (torch's ops): equal to the last bit but for a rare one-ulp
    difference of the float32 mean of squares. The Triton kernel ran (registry), at Ideogram 4's width and odd ones,
    with a per-item or a shared modulation vector."""
    x, y, w, scale, gate = _block_operands(gen, b, n, c, dtype, vec_batch)
    eps = 1e-5
    before = launches("rms_modulate_triton")
    pre = K.rms_norm_modulate(x, w, scale, eps)
    res = K.rms_norm_gated_residual(x, y, w, gate, eps)
    assert launches("rms_modulate_triton") == before + 2
    assert pre.shape == res.shape == x.shape and pre.dtype == res.dtype == dtype

    def norm64(t):
        t = t.double()
        return _rounded64(t / (t.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w.double(), dtype)

    def ulp(t):
        return torch.finfo(dtype).eps * t.abs().clamp_min(torch.finfo(dtype).tiny)

    pre64 = _rounded64(norm64(x) * scale.double(), dtype)
    added64 = _rounded64(gate.double() * norm64(y), dtype)
    res64 = _rounded64(x.double() + added64, dtype)
    # A one-ulp move of a normalized value carries into the residual sum as an ulp of the added term, which is
    # larger than the sum's own where x cancels it (seed-found: 0.2043 against 0.2039 for x = -0.188).
    for got, want, slack, twin in (
        (pre, pre64, 2 * ulp(pre64), K.rms_norm_modulate_ref(x, w, scale, eps)),
        (res, res64, 2 * ulp(res64) + 2 * ulp(added64), K.rms_norm_gated_residual_ref(x, y, w, gate, eps)),
    ):
        err = (got.double() - want).abs()
        assert (err <= slack).all(), f"seed {gen.initial_seed()}: worst excess {(err - slack).max().item():.3g}"
        assert (got.double() != want).float().mean().item() <= 0.01 and (got != twin).float().mean().item() <= 0.01


def test_rms_norm_modulate_keeps_a_nan_row_to_itself_and_falls_back_where_the_kernel_cannot_read(gen):
    """A NaN in one row stays in that row; a modulation vector the kernel cannot read (another shape, float32 against
    bf16 rows) and a non-contiguous x run the twin; a bad x is refused by name."""
    x, y, w, scale, gate = _block_operands(gen, 1, 4, 64, torch.bfloat16, 1)
    x[0, 2, 5] = float("nan")
    out = K.rms_norm_modulate(x, w, scale, 1e-6)
    assert out[0, 2].isnan().all() and not out[0, [0, 1, 3]].isnan().any()
    before = launches("rms_modulate_triton")
    for args in (
        (x, w, scale.float(), 1e-6),
        (x, w, scale.expand(1, 4, 64), 1e-6),
        (x.transpose(1, 2).contiguous().transpose(1, 2), w, scale, 1e-6),
    ):
        assert torch.equal(K.rms_norm_modulate(*args).nan_to_num(7.0), K.rms_norm_modulate_ref(*args).nan_to_num(7.0))
    assert launches("rms_modulate_triton") == before
    with pytest.raises(K.KernelInputError, match="rms_norm_gated_residual: x must be a float"):
        K.rms_norm_gated_residual(x[0], y[0], w, gate, 1e-6)


@pytest.mark.parametrize(
    ("c", "tiles"),
    [
        (4608, (4096, 512)),
        (320, (256, 64)),
        (4096, (4096, 0)),
        (100, (128, 0)),
        (72, (128, 0)),
        (1040, (1024, 16)),
        (1048, (2048, 0)),
        (1032, (2048, 0)),
    ],
)
def test_the_block_norm_kernel_holds_a_row_as_a_head_and_a_tail_tile_where_the_width_allows(c, tiles):
    """4608 = 4096 + 512 (and 256 + 64) as a head and a tail tile, a power of two as one tile, other widths (a
    remainder that is no power of two, or under 16) as one masked tile. Their values are the float64 and twin tests'
    above (4608, 100, 72 columns); warp counts, which the interpreter ignores, are the GPU test's."""
    from comfyui_ideogram4_int8.kernels.rms_modulate_triton import row_tiles

    assert row_tiles(c) == tiles


def test_a_block_norm_kernel_that_fails_is_demoted_with_its_reason_and_the_twin_runs(gen, monkeypatch):
    """A variant of the block-norm kernel that fails to build or launch never raises: that variant is demoted with
    the error in its reason (the panel's note reads it), this call and the later ones run the twin and hand nothing
    off, and the other variants keep the kernel."""
    from comfyui_ideogram4_int8.kernels import dispatch, handoff
    from comfyui_ideogram4_int8.kernels import rms_modulate_triton as M

    x, y, w, scale, gate = _block_operands(gen, 1, 4, 320, torch.bfloat16, 1)
    real = M.rms_modulate_triton

    def fails_quantized(*args, **kwargs):
        if len(args) > 6 and args[6]:
            raise RuntimeError("out of resources: shared memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(M, "rms_modulate_triton", fails_quantized)
    backends.DEMOTIONS.clear()
    handoff.clear()
    try:
        before = launches("rms_modulate_triton")
        for _ in range(2):
            got = K.rms_norm_modulate(x, w, scale, 1e-5, hand_off=True)
            assert torch.equal(got, K.rms_norm_modulate_ref(x, w, scale, 1e-5)) and not handoff.pending()
        assert launches("rms_modulate_triton") == before
        why = dispatch.block_norm_demotion()
        assert why is not None and "rms_modulate" in why and "out of resources: shared memory" in why
        K.rms_norm_modulate(x, w, scale, 1e-5)  # the plain pre-norm and the residual keep the kernel
        K.rms_norm_gated_residual(x, y, w, gate, 1e-5)
        assert launches("rms_modulate_triton") == before + 2
    finally:
        backends.DEMOTIONS.clear()


# -- the pre-norm's quantized output handed to the linear it feeds (kernels/handoff.py) ----------------------


def _handed(x, w, scale, eps=1e-5):
    """The pre-norm with its handoff: (output, the offer as quantize_per_token takes it)."""
    from comfyui_ideogram4_int8.kernels import handoff

    handoff.clear()
    before = launches("rms_modulate_triton")
    out = K.rms_norm_modulate(x, w, scale, eps, hand_off=True)
    assert launches("rms_modulate_triton") == before + 1 and handoff.pending()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("b", "n", "c", "vec_batch"), [(1, 3, 4608, 1), (2, 5, 100, 2), (1, 7, 72, 1)])
def test_the_pre_norm_hands_its_output_over_quantized_bit_for_bit(dtype, b, n, c, vec_batch, gen):
    """The int8 rows and scales the pre-norm writes in its pass are bit for bit the twin quantizer's of its stored
    output (outlier channel, a zero row, a NaN row included); the next quantization of that output takes them (no
    quantizer kernel: the registry counts a handoff), and the one after quantizes again. The output itself is the
    pre-norm's without the handoff, to the bit."""
    from comfyui_ideogram4_int8.kernels import handoff

    x, _, w, scale, _ = _block_operands(gen, b, n, c, dtype, vec_batch)
    x[0, 1] = 0.0  # a zero row: scale 0, zeros
    x[-1, -1, c // 2] = float("nan")  # a NaN row: scale NaN, zeros (its output row is NaN)
    out = _handed(x, w, scale)
    assert torch.equal(out.nan_to_num(7.0), K.rms_norm_modulate(x, w, scale, 1e-5).nan_to_num(7.0))
    want_q, want_s = K.quantize_per_token_ref(out.view(-1, c))
    quant, handed = launches("quant_triton"), launches("quant_handoff")
    q, s = K.quantize_per_token(out)
    assert launches("quant_handoff") == handed + 1 and launches("quant_triton") == quant
    assert not handoff.pending()
    assert q.shape == out.shape and s.shape == out.shape[:-1]
    assert torch.equal(q.view(-1, c), want_q)
    assert torch.equal(s.view(-1).nan_to_num(-1.0), want_s.nan_to_num(-1.0))
    assert s.view(-1)[-1].isnan() and s[0, 1] == 0 and not q[0, 1].any()
    q2, _ = K.quantize_per_token(out)  # taken once: the next call runs the quantizer
    assert launches("quant_triton") == quant + 1 and torch.equal(q2.view(-1, c), want_q)


def test_a_handed_over_quantization_is_taken_only_for_that_tensor_unchanged_and_undivided(gen):
    """No claim for: another tensor of the same shape and values, the output after an in-place write, a
    quantization that divides by a smoothing vector or rotates (ConvRot), another thread; ``clear`` drops the
    offer. Each of these quantizes the values it was given."""
    import threading

    from comfyui_ideogram4_int8.kernels import handoff

    c = 256
    x, _, w, scale, _ = _block_operands(gen, 1, 6, c, torch.bfloat16, 1)
    out = _handed(x, w, scale)
    handed = launches("quant_handoff")
    assert handoff.claim(out.view(torch.float16).view(-1, c)) is None  # the same bytes read as another dtype
    copy = out.clone()
    assert torch.equal(K.quantize_per_token(copy)[0], K.quantize_per_token_ref(copy.view(-1, c))[0].view(1, 6, c))
    smooth = torch.rand(c, generator=gen) + 0.5
    assert torch.equal(
        K.quantize_per_token(out, smooth=smooth)[0].view(-1, c), K.quantize_per_token_ref(out.view(-1, c), smooth)[0]
    )
    K.quantize_per_token(out, convrot_group=16)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(handoff.claim(out.view(-1, c))))
    worker.start()
    worker.join()
    assert seen == [None] and handoff.pending() and launches("quant_handoff") == handed
    out[0, 2, 7] = 1000.0  # written after the offer
    q, _ = K.quantize_per_token(out)
    assert torch.equal(q.view(-1, c), K.quantize_per_token_ref(out.view(-1, c))[0]) and q[0, 2, 7] == 127
    assert launches("quant_handoff") == handed
    handoff.clear()
    out = _handed(x, w, scale)
    handoff.clear()
    assert not handoff.pending() and handoff.claim(out.view(-1, c)) is None


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_linear_fed_by_the_pre_norm_equals_its_own_quantization(mode, gen):
    """w8a8_linear and the SwiGLU pair on the handed-over output give what they give on a copy of it (their own
    quantization), to the bit, and count the handoff; also under torch.inference_mode, as ComfyUI runs its nodes
    (inference tensors have no version counter)."""
    with getattr(torch, mode)():
        _linear_fed_by_the_pre_norm(gen)


def _linear_fed_by_the_pre_norm(gen):
    from comfyui_ideogram4_int8.kernels import handoff

    c, f = 4608, 96
    x, _, w, scale, _ = _block_operands(gen, 1, 5, c, torch.bfloat16, 1)
    w8, ws = int8((f, c), gen), torch.rand(f, generator=gen) * 0.01
    w3, ws3 = int8((f, c), gen), torch.rand(f, generator=gen) * 0.01
    out = _handed(x, w, scale)
    handed = launches("quant_handoff")
    got = K.w8a8_linear(out, w8, ws)
    assert launches("quant_handoff") == handed + 1
    assert torch.equal(got, K.w8a8_linear(out.clone(), w8, ws))
    out = _handed(x, w, scale)
    got = K.swiglu_w8a8_pair(out, w8, ws, w3, ws3)
    assert launches("quant_handoff") == handed + 2 and not handoff.pending()
    assert torch.equal(got, K.swiglu_w8a8_pair(out.clone(), w8, ws, w3, ws3))
