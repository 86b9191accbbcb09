"""FP8 kernels on the CPU interpreter: the e4m3 quantizer against its twin, the FP8 linear against float64 of its
e4m3 operands, its fallbacks and refusals."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends
from kernel_checks import activations, check_fp8_linear, e4m3_step, fp8_weight, rel_err

pytestmark = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None,
    reason="Triton interpreter not available (needs triton + TRITON_INTERPRET=1)",
)


FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k", [(3, 700), (2, 4608), (2, 12288), (5, 3000)])
def test_fp8_codes_are_the_twins_bit_for_bit(dtype, m, k, gen):
    """The quantizer's e4m3 codes (kernels/quant_triton.py, for FP8 GEMMs): one row in registers (700), a head and a
    tail tile (4608, and w2's 12288 = 8192 + 4096), two passes (3000); outlier channels, a zero, a NaN and an Inf
    row; codes, their round trip within half a step of e4m3's grid, scale = absmax / 448."""
    from comfyui_ideogram4_int8.kernels.quant_triton import quantize_rows_triton

    x = activations(m + 3, k, gen, dtype=dtype)
    x[:, 7] *= 300.0
    x[0, :4] = -0.0  # e4m3 has a -0 code: the GPU's cvt keeps the sign, so the kernel must everywhere
    x[m] = 0.0
    x[m + 1, 11] = float("nan")
    x[m + 2, 5] = float("inf")
    q, s = quantize_rows_triton(x, codes=FP8)  # the kernel itself (the interpreter here), not a dispatcher
    qr, sr = K.quantize_per_token_ref(x, codes=FP8)
    assert q.dtype == FP8 and s.dtype == torch.float32
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8)), f"seed {gen.initial_seed()}"
    assert torch.equal(s.nan_to_num(-1.0), sr.nan_to_num(-1.0))
    assert s[m] == 0 and not q[m].float().any() and s[m + 1].isnan() and s[m + 2].isnan()
    assert not q[m + 1 :].float().any()
    rows = x[:m].double()
    assert torch.equal(s[:m].double(), (rows.abs().amax(1).float() / 448.0).double())
    v = rows / s[:m, None].double()  # what was rounded, in float64
    back = q[:m].double()
    # within half an e4m3 step; the kernel rounds fl32(x * fl32(448 / amax)), not x / s in float64: up to 3 float32
    # ulps of v apart
    assert ((back - v).abs() <= e4m3_step(v) / 2 + 2.0**-22 * v.abs()).all(), f"seed {gen.initial_seed()}"
    assert back.abs().max() <= 448.0


def test_fp8_codes_round_half_to_even_and_up_into_the_next_binade():
    """Rows whose absmax is 448 (inv = 1): e4m3 spacing is 16 between 128 and 256, 32 above; halves go to the even
    code, and 126.7 rounds up to 128 (the interpreter's own float32 -> e4m3 cast gave 64 there)."""
    from comfyui_ideogram4_int8.kernels.quant_triton import quantize_rows_triton

    x = torch.tensor([[448.0, 136.0, 152.0, 126.7, -126.7, 0.0009765625, 0.0029296875, 440.0]])
    q, s = quantize_rows_triton(x, codes=FP8)
    assert s.item() == 1.0
    assert q.float().tolist() == [[448.0, 128.0, 160.0, 128.0, -128.0, 0.0, 0.00390625, 448.0]]
    assert torch.equal(q.view(torch.uint8), K.quantize_per_token_ref(x, codes=FP8)[0].view(torch.uint8))


@pytest.mark.parametrize("m", [1, 17, 130])
@pytest.mark.parametrize("n,k", [(40, 64), (200, 96), (72, 1000)])
def test_fp8_linear_is_the_float64_product_of_its_e4m3_operands(m, n, k, gen):
    """The ``triton-fp8`` path (kernels/fp8_gemm.py): per-token e4m3 rows times an e4m3 weight with one scale, float32
    accumulation, scales and bias in the epilogue; K not a multiple of the tile (1000) takes the masked loop."""
    check_fp8_linear(m, n, k, gen)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fp8_matmul_writes_every_element(out_dtype, gen):
    m, n, k = 45, 72, 192
    q, qs = K.quantize_per_token_ref(activations(m, k, gen), codes=FP8)
    w, s = fp8_weight(n, k, gen)
    ws = (torch.rand(n, generator=gen) + 0.5) * s  # per-channel scales work too
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    got = K.fp8_matmul(q, w, qs, ws, None, out_dtype=out_dtype, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    ref = K.fp8_matmul_ref(q, w, qs, ws, None, out_dtype=torch.float64)
    if out_dtype == torch.float32:
        assert rel_err(got, ref) < 1e-5
        return
    # bf16: within one bf16 ulp (<= 2^-7 |y|) of the float32 twin element by element, plus both float32 sums' roundings.
    # One ulp since the Triton interpreter's float32 -> bf16 cast truncates (a GPU's rounds to nearest); a norm-wise
    # 4e-3 failed 3% of interpreter draws.
    size = (q.float().double().abs() * qs.double()[:, None]) @ (w.float().double().abs() * ws.double()[:, None]).t()
    tol = 2.0**-7 * ref.abs() + 2 * (k + 2) * 2.0**-24 * size
    assert ((got.double() - ref).abs() <= tol).all(), f"seed {gen.initial_seed()}"


def test_fp8_linear_float_fallback_is_the_dequantized_product_and_says_why(gen):
    x = activations(9, 64, gen)
    w, s = fp8_weight(24, 64, gen)
    y = K.fp8_linear(x, w, s, site="test/fp8_forced", float_only="forced for the test")
    assert K.REGISTRY.path_of("test/fp8_forced") == K.PATH_BF16
    rec = next(r for r in K.REGISTRY.layers() if r.site == "test/fp8_forced")
    assert rec.reason == "fp8 weight dequantized: forced for the test"
    assert _is_float32_dot_of(y, x, K.dequant_fp8_ref(w, s, torch.float64)), f"seed {gen.initial_seed()}"


def _is_float32_dot_of(y, x, wd):
    """y = x . wd^T in float32 (a K-term dot product, then one scale multiply): element by element within
    (K + 2) u |x|.|wd|^T of the float64 product (a norm-wise 1e-6 failed ~6e-5 of draws on cancellation)."""
    tol = (x.shape[-1] + 2) * 2.0**-24 * (x.double().abs() @ wd.abs().t())
    return bool(((y.double() - x.double() @ wd.t()).abs() <= tol).all())


def test_fp8_layers_follow_the_forced_dequant_path(gen, setting):
    """IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16 (a float comparison run) takes the fp8 layers float too, and says so."""
    setting(K.ENV_PATH, K.PATH_DEQUANT)
    x = activations(3, 64, gen)
    w, s = fp8_weight(16, 64, gen)
    K.fp8_linear(x, w, s, site="test/fp8_env")
    rec = next(r for r in K.REGISTRY.layers() if r.site == "test/fp8_env")
    assert (rec.path, rec.reason) == (
        K.PATH_BF16,
        "fp8 weight dequantized: forced by IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16",
    )


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda q, qs, w, ws: (q, w, qs[:-1], ws), "q_scale must have shape"),
        (lambda q, qs, w, ws: (q, w, qs, ws[:3]), "w_scale must have shape"),
        (lambda q, qs, w, ws: (q, w.float(), qs, ws), "float8_e4m3fn"),
    ],
)
def test_fp8_matmul_refuses_bad_scales(bad, match, gen):
    q, qs = K.quantize_per_token_ref(activations(5, 64, gen), codes=FP8)
    w, s = fp8_weight(8, 64, gen)
    with pytest.raises(K.KernelInputError, match=match):
        K.fp8_matmul(*bad(q, qs, w, s.reshape(1).expand(8).contiguous()))


def test_fp8_matmul_takes_one_scale_for_the_tensor(gen):
    q, qs = K.quantize_per_token_ref(activations(5, 64, gen), codes=FP8)
    w, s = fp8_weight(8, 64, gen)
    got = K.fp8_matmul(q, w, qs, s, out_dtype=torch.float32)  # a 0-d scale, as ComfyUI stores it
    assert rel_err(got, K.fp8_matmul_ref(q, w, qs, s.reshape(1).expand(8), out_dtype=torch.float64)) < 1e-5


def test_fp8_gemm_failure_is_demoted_once_and_the_layer_runs_float(gen, monkeypatch):
    from comfyui_ideogram4_int8.kernels import fp8_gemm

    tries = []

    def fails(*a, **kw):
        tries.append(1)
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(fp8_gemm, "fp8_matmul", fails)
    x = activations(5, 128, gen)
    w, s = fp8_weight(32, 128, gen)
    try:
        ys = [K.fp8_linear(x, w, s, site="test/fp8_demoted") for _ in range(2)]
        rec = next(r for r in K.REGISTRY.layers() if r.site == "test/fp8_demoted")
        assert rec.path == K.PATH_BF16 and "out of resources: shared memory" in rec.reason
        assert len(tries) == 1, "a demoted shape must not be tried again"
        wd = K.dequant_fp8_ref(w, s, torch.float64)
        assert all(_is_float32_dot_of(y, x, wd) for y in ys), f"seed {gen.initial_seed()}"
    finally:
        K.DEMOTIONS.clear()


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda x, w, s: (x, w.float(), s), "float8_e4m3fn"),
        (lambda x, w, s: (x[:, :-1], w, s), "last dim must be K"),
        (lambda x, w, s: (x.to(torch.int8), w, s), "float32/float16/bfloat16"),
        (lambda x, w, s: (x, w, torch.ones(3)), "w_scale has 3 values"),
    ],
)
def test_fp8_linear_refuses_bad_operands(bad, match, gen):
    x = activations(4, 64, gen)
    w, s = fp8_weight(16, 64, gen)
    with pytest.raises(K.KernelInputError, match=match):
        K.fp8_linear(*bad(x, w, s))
