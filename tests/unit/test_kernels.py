"""Kernel correctness on the CPU: Triton kernels on the interpreter (TRITON_INTERPRET=1).

Every test draws fresh random data; results are compared bit-exactly with torch._int_mm / the
twin, or with float64 references of the same quantized operands.
"""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm
from kernel_checks import (
    activations,
    check_fp8_linear,
    check_quantize_edge_rows,
    check_rotated_quantizer,
    cosine,
    e4m3_step,
    fp8_weight,
    int8,
    launches,
    reference_f64,
    rel_err,
    weight,
)

pytestmark = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None,
    reason="Triton interpreter not available (needs triton + TRITON_INTERPRET=1)",
)

POISON_I32 = -(2**31) + 7


# -- int8 x int8 -> int32: bit-exact ------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 17, 333])
@pytest.mark.parametrize("n,k", [(40, 64), (200, 96), (136, 384), (72, 1000)])
def test_int32_accumulator_bit_exact(m, n, k, gen):
    q, w = int8((m, k), gen), int8((n, k), gen)
    out = torch.full((m, n), POISON_I32, dtype=torch.int32)
    before = launches("gemm_triton")
    got = K.int8_matmul_int32(q, w, out=out)
    assert launches("gemm_triton") == before + 1, "the Triton kernel did not run"
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, torch._int_mm(q, w.t())), f"seed {gen.initial_seed()}"


def test_int32_extreme_values_bit_exact(gen):
    # all +-127 / -128 stress the accumulator sign handling
    m, n, k = 33, 48, 512
    q = torch.where(torch.rand(m, k, generator=gen) > 0.5, 127, -127).to(torch.int8)
    w = torch.where(torch.rand(n, k, generator=gen) > 0.5, 127, -128).to(torch.int8)
    assert torch.equal(K.int8_matmul_int32(q, w), torch._int_mm(q, w.t()))


@pytest.mark.parametrize(
    "cfg",
    [
        C.GemmConfig("triton", 64, 64, 32, group_m=4, num_warps=4, num_stages=2),
        C.GemmConfig("triton", 16, 64, 64, group_m=1, num_warps=4, num_stages=2),
        # split-K with a ragged last slice
        C.GemmConfig("triton", 64, 32, 64, group_m=8, split_k=3, num_warps=4, num_stages=2),
        C.GemmConfig("triton", 32, 64, 32, group_m=2, split_k=4, num_warps=4, num_stages=2),
        # TMA descriptors, persistent tile loop
        C.GemmConfig("triton-tma", 32, 64, 32, group_m=2, num_warps=4, num_stages=2),
    ],
    ids=lambda c: c.key(),
)
def test_every_config_family_bit_exact(cfg, gen):
    """Tile shapes, group ordering and split-K (int32 partial slices) all give the exact accumulator."""
    m, n, k = 70, 100, 200
    q, w = int8((m, k), gen), int8((n, k), gen)
    out = torch.full((m, n), POISON_I32, dtype=torch.int32)
    launch_gemm(q, w, cfg, out=out, raw_int32=True)
    assert torch.equal(out, torch._int_mm(q, w.t())), f"{cfg.key()} seed {gen.initial_seed()}"


@pytest.mark.parametrize(
    "cfg",
    [
        C.GemmConfig("triton", 32, 32, 64, group_m=1, num_warps=4, num_stages=2),
        C.GemmConfig("triton", 32, 32, 64, group_m=1, split_k=4, num_warps=4, num_stages=2),
        C.GemmConfig("triton-tma", 32, 32, 64, group_m=2, num_warps=4, num_stages=2),
        C.GemmConfig("triton-tma", 32, 32, 64, group_m=2, num_warps=4, num_stages=2, subtile=True),
    ],
    ids=lambda c: c.key(),
)
def test_fused_epilogue_every_variant_matches_twin(cfg, gen):
    m, n, k = 40, 80, 512  # n = 80: float32 TMA rows 16-element aligned (the 3.4/3.5 interpreters count elements)
    x = activations(m, k, gen)
    q, s = K.quantize_per_token(x)
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen)
    out = torch.full((m, n), float("nan"), dtype=torch.float32)
    launch_gemm(q, w, cfg, s, ws, bias, out)
    assert torch.equal(out, K.int8_matmul_ref(q, w, s, ws, bias, out_dtype=torch.float32))


# -- activation quantization: identical to the twin ---------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,k", [(1, 64), (17, 300), (40, 4608), (3, 20000)])
@pytest.mark.parametrize("smooth", [False, True])
def test_quantize_identical_to_twin(dtype, m, k, smooth, gen):
    x = activations(m, k, gen, dtype=dtype)
    sm = (torch.rand(k, generator=gen) * 4 + 0.25) if smooth else None
    before = launches("quant_triton")
    q, s = K.quantize_per_token(x, sm)
    assert launches("quant_triton") == before + 1
    qr, sr = K.quantize_per_token_ref(x, sm)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    assert torch.equal(q, qr), f"seed {gen.initial_seed()}"
    assert torch.equal(s, sr), f"seed {gen.initial_seed()}"
    assert q.abs().max() <= 127


def test_quantize_rounds_half_to_even():
    # row absmax 127 -> inv = 1 exactly, so q = rint(x): halves go to the even neighbour
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]])
    q, s = K.quantize_per_token(x)
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -2, 126]]
    assert s.item() == 1.0


def test_quantize_zero_nan_inf_rows_stay_confined(gen):
    x = activations(6, 256, gen)
    x[1] = 0.0
    x[3, 17] = float("nan")
    x[4, 5] = float("inf")
    q, s = K.quantize_per_token(x)
    qr, sr = K.quantize_per_token_ref(x)
    assert torch.equal(q, qr) and torch.equal(s.isnan(), sr.isnan())
    assert s[1] == 0 and (q[1] == 0).all()
    assert s[3].isnan() and s[4].isnan() and (q[3] == 0).all() and (q[4] == 0).all()
    healthy = [0, 2, 5]
    assert torch.isfinite(s[healthy]).all() and (s[healthy] > 0).all()
    assert torch.equal(q[healthy], K.quantize_per_token_ref(x[healthy])[0])


@pytest.mark.parametrize("k", [256, 4608])
def test_quantize_extreme_rows_match_twin(k, gen):
    check_quantize_edge_rows(k, gen)


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


def test_quantize_keeps_leading_dims(gen):
    x = activations(2 * 3, 64, gen).reshape(2, 3, 64)
    q, s = K.quantize_per_token(x)
    assert q.shape == (2, 3, 64) and s.shape == (2, 3)
    qr, sr = K.quantize_per_token_ref(x.reshape(6, 64))
    assert torch.equal(q.reshape(6, 64), qr) and torch.equal(s.reshape(6), sr)


# -- whole linear vs float64 --------------------------------------------------------------------

SMALL_IDEOGRAM_LIKE = {  # the real layer ratios at 1/16 width
    "qkv": (864, 288),
    "o": (288, 288),
    "w1": (768, 288),
    "w2": (288, 768),
    "adaln": (1152, 32),
    "llm_cond_proj": (288, 3328),
}


@pytest.mark.parametrize("name", list(SMALL_IDEOGRAM_LIKE))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a8_linear_triton_vs_float64(name, dtype, with_bias, gen):
    n, k = SMALL_IDEOGRAM_LIKE[name]
    m = 37 if name != "llm_cond_proj" else 24
    x = activations(m, k, gen, dtype=dtype)
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen) if with_bias else None
    smooth = torch.rand(k, generator=gen) * 2 + 0.5
    site = f"test/{name}"
    y = K.w8a8_linear(x, w, ws, bias, smooth=smooth, path="triton-int8", site=site)
    assert K.REGISTRY.path_of(site) == "triton-int8"
    assert y.dtype == dtype and y.shape == (m, n)
    q, s = K.quantize_per_token_ref(x, smooth)
    ref = reference_f64(q, s, w, ws, bias)
    tol = 1e-2 if dtype != torch.float32 else 1e-6
    assert rel_err(y, ref) <= tol, f"seed {gen.initial_seed()}"
    assert cosine(y, ref) >= 0.9999


def test_w8a8_linear_zero_rows_give_exact_bias(gen):
    n, k = 96, 128
    x = activations(5, k, gen, dtype=torch.bfloat16)
    x[2] = 0
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen).bfloat16()
    for path in ("triton-int8", "cublas-int8", "dequant-bf16"):
        y = K.w8a8_linear(x, w, ws, bias, path=path)
        assert torch.equal(y[2], bias), path
        assert torch.isfinite(y).all(), path


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float16])
def test_half_bias_reaches_the_fused_kernel_unconverted_and_exact(bias_dtype, gen, monkeypatch):
    """A bf16/fp16 bias goes into the fused kernel as it is (widened in registers, exactly): the
    output equals the one with the same bias given in float32, and no float32 copy was made."""
    from comfyui_ideogram4_int8.kernels import dispatch

    n, k, m = 136, 288, 19
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w, ws = weight(n, k, gen)
    bias = (torch.randn(n, generator=gen) * 3).to(bias_dtype)
    seen = []
    real = dispatch._launch_fused
    monkeypatch.setattr(
        dispatch, "_launch_fused", lambda q, w, qs, s, b, *a, **kw: seen.append(b) or real(q, w, qs, s, b, *a, **kw)
    )
    y_half = K.w8a8_linear(x, w, ws, bias, path="triton-int8")
    y_f32 = K.w8a8_linear(x, w, ws, bias.float(), path="triton-int8")
    assert seen[0] is bias and seen[1].dtype == torch.float32
    assert torch.equal(y_half, y_f32)
    q, s = K.quantize_per_token(x)
    out = torch.full((m, n), float("nan"), dtype=torch.float32)
    assert torch.equal(
        K.int8_matmul(q, w, s, ws, bias, torch.float32, out=out),
        K.int8_matmul_ref(q, w, s, ws, bias.float(), torch.float32),
    )


def test_w8a8_linear_nan_row_confined(gen):
    n, k = 64, 128
    x = activations(4, k, gen)
    x[1, 3] = float("nan")
    w, ws = weight(n, k, gen)
    y = K.w8a8_linear(x, w, ws, path="triton-int8")
    assert y[1].isnan().all()
    assert torch.isfinite(y[[0, 2, 3]]).all()


def test_w8a8_linear_nd_input(gen):
    x = activations(2 * 9, 64, gen).reshape(2, 9, 64)
    w, ws = weight(32, 64, gen)
    y = K.w8a8_linear(x, w, ws, path="triton-int8")
    assert y.shape == (2, 9, 32)
    y2 = K.w8a8_linear(x.reshape(18, 64), w, ws, path="triton-int8")
    assert torch.equal(y.reshape(18, 32), y2)


@pytest.mark.parametrize("path", ["cublas-int8", "dequant-bf16"])
def test_fallback_paths_vs_float64(path, gen):
    n, k, m = 200, 256, 33
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w, ws = weight(n, k, gen)
    bias = torch.randn(n, generator=gen)
    smooth = torch.rand(k, generator=gen) + 0.5
    y = K.w8a8_linear(x, w, ws, bias, smooth=smooth, path=path, site=f"test/{path}")
    assert K.REGISTRY.path_of(f"test/{path}") == path
    q, s = K.quantize_per_token_ref(x, smooth)
    ref = reference_f64(q, s, w, ws, bias)
    # dequant-bf16 rounds both operands to bf16 before the matmul: a looser, still tight, bound
    assert rel_err(y, ref) <= (1e-2 if path == "cublas-int8" else 2e-2)
    assert cosine(y, ref) >= 0.9999


def test_int8_matmul_writes_every_output(gen):
    m, n, k = 50, 70, 96
    q, w = int8((m, k), gen), int8((n, k), gen)
    s = torch.rand(m, generator=gen)
    ws = torch.rand(n, generator=gen)
    out = torch.full((m, n), float("nan"), dtype=torch.float32)
    K.int8_matmul(q, w, s, ws, out_dtype=torch.float32, out=out)
    assert torch.isfinite(out).all()
    assert torch.equal(out, K.int8_matmul_ref(q, w, s, ws, out_dtype=torch.float32))


def test_scales_accept_bf16_and_column_shape(gen):
    m, n, k = 9, 24, 64
    x = activations(m, k, gen)
    w, ws = weight(n, k, gen)
    a = K.w8a8_linear(x, w, ws.bfloat16().reshape(n, 1), path="triton-int8")
    b = K.w8a8_linear(x, w, ws.bfloat16().float(), path="triton-int8")
    assert torch.equal(a, b)


# -- dispatch and registry ----------------------------------------------------------------------


def test_auto_path_on_cpu_is_labelled_fallback(gen):
    x = activations(4, 64, gen)
    w, ws = weight(16, 64, gen)
    K.w8a8_linear(x, w, ws, site="auto/cpu")
    rec = next(r for r in K.REGISTRY.layers("auto") if r.layer == "cpu")
    assert rec.path == "cublas-int8"
    assert "CUDA" in rec.reason  # says why the fused path was not taken


def test_env_var_forces_path_leniently(gen, setting):
    x = activations(4, 64, gen)
    w, ws = weight(16, 64, gen)
    setting(K.ENV_PATH, "dequant-bf16")
    K.w8a8_linear(x, w, ws, site="env/a")
    assert K.REGISTRY.path_of("env/a") == "dequant-bf16"
    setting(K.ENV_PATH, "no-such-path")
    K.w8a8_linear(x, w, ws, site="env/b")
    rec = next(r for r in K.REGISTRY.layers("env") if r.layer == "b")
    assert rec.path == "cublas-int8" and "no-such-path" in rec.reason


def test_forced_path_argument_is_strict(gen):
    with pytest.raises(K.GemmPathUnavailable, match="expected one of"):
        K.w8a8_linear(activations(2, 64, gen), *weight(16, 64, gen), path="fp8")


def test_registry_counts_and_models(gen):
    K.REGISTRY.clear("regtest")
    w, ws = weight(16, 64, gen)
    x = activations(3, 64, gen)
    K.w8a8_linear(x, w, ws, path="triton-int8", site="regtest/a")
    K.w8a8_linear(x, w, ws, path="dequant-bf16", site="regtest/b")
    K.float_linear(x, torch.randn(16, 64, generator=gen), site="regtest/c", reason="protected layer")
    counts = K.REGISTRY.counts("regtest")
    assert counts == {"triton-int8": 1, "triton-fp8": 0, "cublas-int8": 0, "dequant-bf16": 1, "bf16": 1}
    assert "regtest" in K.REGISTRY.models()
    rec = {r.layer: r for r in K.REGISTRY.layers("regtest")}
    assert rec["a"].config is not None and rec["a"].config_source
    assert rec["c"].reason == "protected layer"


# -- bad input ------------------------------------------------------------------------------------


def test_bad_inputs_name_the_argument(gen):
    w, ws = weight(16, 64, gen)
    x = activations(3, 64, gen)
    with pytest.raises(K.KernelInputError, match="last dim must be K"):
        K.w8a8_linear(activations(3, 63, gen), w, ws)
    with pytest.raises(K.KernelInputError, match="w8a8_linear: w must be a 2-D int8"):
        K.w8a8_linear(x, w.float(), ws)
    with pytest.raises(K.KernelInputError, match="K-contiguous"):
        K.w8a8_linear(x, int8((64, 16), gen).t(), ws)
    with pytest.raises(K.KernelInputError, match=r"w_scale must have shape \[16\]"):
        K.w8a8_linear(x, w, ws[:15])
    with pytest.raises(K.KernelInputError, match=r"smooth must have shape \[64\]"):
        K.w8a8_linear(x, w, ws, smooth=torch.ones(32))
    with pytest.raises(K.KernelInputError, match="x must be float"):
        K.w8a8_linear(x.int(), w, ws)
    with pytest.raises(K.KernelInputError, match="K must match"):
        K.int8_matmul_int32(int8((3, 32), gen), w)
    with pytest.raises(K.KernelInputError, match="exceeds 133144"):
        K.int8_matmul_int32(int8((1, 133145), gen), int8((1, 133145), gen))
    with pytest.raises(K.KernelInputError, match="out must be"):
        K.int8_matmul_int32(int8((3, 64), gen), w, out=torch.empty(3, 16))


def test_config_spaces_fit_their_architectures():
    for arch, limit in C.SMEM_LIMIT.items():
        for m in (16, 512, 4608):
            space = C.config_space(arch, m)
            assert space, (arch, m)
            assert all(c.smem_bytes() <= limit and c.problem() is None for c in space)
    # Hopper's large-M tiles must all qualify for int8 wgmma
    assert all(c.uses_wgmma_on_hopper() for c in C.config_space("sm90", 4608))
    # sm86 has ~99 KB: no 3-stage 128x128x128 tile there
    assert all(c.smem_bytes() <= 96 * 1024 for c in C.config_space("sm86", 4608))


def test_heuristic_splits_long_k_few_tiles():
    cfg = C.heuristic_config("sm90", 512, 4608, 53248)
    assert cfg.split_k > 1
    assert C.heuristic_config("sm90", 4608, 13824, 4608).split_k == 1


def test_every_shipped_pick_lies_in_its_search_space_and_says_where_it_was_measured():
    from comfyui_ideogram4_int8.kernels import tuning

    entries = tuning.shipped_table()
    assert entries
    for e in entries:
        cfg = C.GemmConfig.from_dict(e["config"])
        # a known arch (CONFIG_SPACES' keys are the ones the picker and the offline compile serve), a config its
        # autotuning could have chosen
        assert cfg in C.CONFIG_SPACES[e["arch"]], (e["gpu"], e["N"], e["K"], cfg.key())
        assert cfg.problem(2, swiglu=e["epilogue"] != "linear") is None, cfg.key()
        assert e["measured"].strip() and "commit" in e["measured"]
        assert e["triton"].count(".") == 1 and e["epilogue"] in tuning.EPILOGUES
        assert e["m_bucket"] == C.m_bucket(e["m_bucket"])  # a real bucket
    keys = [(e["arch"], e["gpu"], e["triton"], e["N"], e["K"], e["m_bucket"], e["epilogue"]) for e in entries]
    assert len(keys) == len(set(keys)), "two entries for one key"


def test_shipped_lookup_by_gpu_then_arch_and_never_across_triton_lines():
    from comfyui_ideogram4_int8.kernels import tuning

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    cfg, source = tuning.shipped_config("sm90", h200, "3.6", 4096, 4608, 12288)
    assert cfg.kernel == "gluon-pingpong" and source == "shipped table (NVIDIA H200, Triton 3.6)"
    cfg, source = tuning.shipped_config("sm90", h200, "3.6", 4608, 13824, 4608)
    assert cfg.is_gluon and f"{h100}, same arch" in source
    assert tuning.shipped_config("sm90", h100, "3.9", 4608, 13824, 4608) is None
    assert tuning.shipped_config("sm80", h100, "3.6", 4608, 13824, 4608) is None
    cfg, _ = tuning.shipped_config("sm90", h100, "3.6", 4608, 24576, 4608, epilogue=tuning.EPILOGUE_PAIR)
    assert cfg.block_n == 256
    assert tuning.shipped_config("sm90", h100, "3.6", 4608, 24576, 4608) is None  # a plain linear of that shape


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ({"kernel": "triton", "persistent": 1}, "unknown GemmConfig field"),
        ({"kernel": "cutlass"}, "kernel must be one of"),
        ({"kernel": "triton", "block_m": "128"}, "expected int"),
        ({"kernel": "triton", "block_m": 96}, "powers of two"),
        ({"kernel": "gluon-ws", "block_m": 64, "block_n": 256}, "64 rows per consumer"),
        ({"kernel": "gluon-ws", "block_n": 256, "num_stages": 6}, "shared memory"),
        ({"kernel": "triton-tma", "split_k": 2}, "runs unsplit"),
    ],
)
def test_config_from_dict_is_strict(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        C.GemmConfig.from_dict(bad)


def test_config_keys_are_one_format_and_unique():
    space = {c for cs in C.CONFIG_SPACES.values() for c in cs}
    keys = {c.key() for c in space}
    assert len(keys) == len(space)
    split = C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4, split_k=5)
    assert split.key() == "gluon-ws/128x256x128/g8/w4/s4/sk5/e64"
    tma = C.GemmConfig("triton-tma", 128, 256, 128, num_warps=8, subtile=True)
    assert tma.key() == "triton-tma/128x256x128/g8/w8/s3/sub"


def test_autotune_cache_is_keyed_by_triton_and_kernel_sources(tmp_path, setting):
    from comfyui_ideogram4_int8.kernels import settings, tuning

    setting(settings.CACHE_DIR, str(tmp_path))
    picker = tuning.ConfigPicker()
    key = ("sm90", "GPU X", "3.6", 4608, 4608, 4096, "linear")
    cfg = C.CONFIG_SPACES["sm90"][0]
    picker._save(key, cfg)
    assert tuning.ConfigPicker()._from_disk(key) == (cfg, "autotuned earlier on this GPU")
    doc = __import__("json").loads((tmp_path / "autotune.json").read_text())
    assert doc["tag"] == tuning.cache_tag() and "triton" in doc["tag"] and "kernels" in doc["tag"]
    doc["tag"] = doc["tag"].replace("kernels ", "kernels 0")  # other kernel sources (or another Triton)
    (tmp_path / "autotune.json").write_text(__import__("json").dumps(doc))
    assert tuning.ConfigPicker()._from_disk(key) is None


# -- SwiGLU gate/up pair read from two weights -------------------------------------------------------------


@pytest.mark.parametrize("persistent", [0, 1])
def test_swiglu_fused_vs_float64(persistent, gen):
    m, f, k = 37, 96, 160
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w1, s1 = weight(f, k, gen)
    w3, s3 = weight(f, k, gen)
    q, s = K.quantize_per_token_ref(x)
    g = reference_f64(q, s, w1, s1)
    u = reference_f64(q, s, w3, s3)
    ref = g * torch.sigmoid(g) * u
    out = torch.full((m, f), float("nan"), dtype=torch.bfloat16)
    kernel = "triton-tma" if persistent else "triton"
    cfg = C.GemmConfig(kernel, 32, 64, 32, group_m=2, num_warps=4, num_stages=2)
    launch_gemm(q, w1, cfg, s, s1, None, out, up=(w3, s3))
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) <= 1e-2 and cosine(out, ref) >= 0.9999
    # through the public entry point, fused and fallback paths agree with the reference
    for path in ("triton-int8", "cublas-int8", "dequant-bf16"):
        h = K.swiglu_w8a8_pair(x.reshape(1, m, k), w1, s1, w3, s3, path=path, site=f"swiglu/{path}")
        assert h.shape == (1, m, f)
        assert K.REGISTRY.path_of(f"swiglu/{path}") == path
        assert rel_err(h[0], ref) <= (1e-2 if path != "dequant-bf16" else 2e-2), path


def _pair_operands(m, f, k, gen, smooth=False):
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w1, s1 = weight(f, k, gen)
    w3, s3 = weight(f, k, gen)
    sm = (torch.rand(k, generator=gen) * 3 + 0.25) if smooth else None
    return x, w1, s1.float(), w3, s3.float(), sm


def _pair_f64(q, s, w1, s1, w3, s3):
    g = reference_f64(q, s, w1, s1)
    u = reference_f64(q, s, w3, s3)
    return g * torch.sigmoid(g) * u


def _interpreter_counts_tma_strides_in_elements() -> bool:
    """Triton 3.4 / 3.5's interpreter asserts a descriptor's strides are multiples of 16 elements; the GPU (and the
    host-side TensorDescriptor, and later interpreters) need 16 bytes."""
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 6)


PAIR_CFGS = [
    C.GemmConfig("triton", 32, 64, 32, group_m=2, num_warps=4, num_stages=2),
    C.GemmConfig("triton", 16, 128, 64, group_m=1, num_warps=4, num_stages=2),  # small-M tile, 64 rows of each
    C.GemmConfig("triton-tma", 32, 64, 32, group_m=2, num_warps=4, num_stages=2),
    C.GemmConfig("triton-tma", 64, 32, 64, group_m=4, num_warps=4, num_stages=2),  # 16 rows of each weight per tile
]


# a tile unlike every PAIR_CFGS one (16 rows of each weight, 16-row M tiles): the pair's result must not depend on it
PAIR_REF_CFG = C.GemmConfig("triton", 16, 32, 32, group_m=1, num_warps=4, num_stages=2)


@pytest.mark.parametrize("cfg", PAIR_CFGS, ids=lambda c: c.key())
@pytest.mark.parametrize("m,f,k", [(37, 96, 160), (1, 64, 64), (70, 128, 96)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gate_up_pair_bit_exact_on_every_kernel_and_tile(cfg, m, f, k, out_dtype, gen):
    """Ideogram's FFN pair scaled down (and odd M): every kernel (pointer, persistent TMA) and tile gives bit for bit
    the same result (the same exact int32 accumulators, the same float32 epilogue ops per element), every element
    written (NaN poison), and the float64 value of the same quantized operands."""
    x, w1, s1, w3, s3, _ = _pair_operands(m, f, k, gen)
    q, s = K.quantize_per_token_ref(x)
    want = torch.full((m, f), float("nan"), dtype=out_dtype)
    launch_gemm(q, w1, PAIR_REF_CFG, s, s1, None, want, up=(w3, s3))
    got = torch.full((m, f), float("nan"), dtype=out_dtype)
    launch_gemm(q, w1, cfg, s, s1, None, got, up=(w3, s3))
    assert not got.isnan().any(), cfg.key()
    assert torch.equal(got, want), f"{cfg.key()} seed {gen.initial_seed()}"
    ref = _pair_f64(q, s, w1, s1, w3, s3)
    assert rel_err(got, ref) <= (1e-2 if out_dtype == torch.bfloat16 else 1e-5) and cosine(got, ref) >= 0.9999


@pytest.mark.parametrize("cfg", PAIR_CFGS, ids=lambda c: c.key())
@pytest.mark.parametrize("m,f,k", [(33, 200, 100), (5, 40, 272), (130, 72, 48)])
def test_gate_up_pair_odd_widths_against_float64(cfg, m, f, k, gen):
    """F no multiple of the tile (rows past F wrapped / zero-filled, never stored), K no multiple of BLOCK_K (and
    K = 100: rows TMA cannot address, so the persistent config runs the pointer kernel): float64 agreement,
    every element written (NaN poison)."""
    if cfg.kernel == "triton-tma" and k % 16 == 0 and f % 16 and _interpreter_counts_tma_strides_in_elements():
        pytest.skip(
            "this Triton's interpreter checks descriptor strides in elements (a float32 row of "
            f"{f} elements, {4 * f} bytes, is 16-byte aligned on the GPU); covered on Triton >= 3.6"
        )
    x, w1, s1, w3, s3, _ = _pair_operands(m, f, k, gen)
    q, s = K.quantize_per_token_ref(x)
    got = torch.full((m, f), float("nan"))
    launch_gemm(q, w1, cfg, s, s1, None, got, up=(w3, s3))
    assert not got.isnan().any()
    ref = _pair_f64(q, s, w1, s1, w3, s3)
    assert rel_err(got, ref) <= 1e-5 and cosine(got, ref) >= 0.99999, f"{cfg.key()} seed {gen.initial_seed()}"


def test_gate_up_pair_writes_nothing_outside_its_output(gen):
    """The output is a view into a larger poisoned buffer (row stride > F): the kernel writes exactly [M, F]."""
    m, f, k = 21, 80, 64
    x, w1, s1, w3, s3, _ = _pair_operands(m, f, k, gen)
    q, s = K.quantize_per_token_ref(x)
    buf = torch.full((m, f + 48), float("nan"))
    cfg = C.GemmConfig("triton", 32, 64, 32, group_m=2, num_warps=4, num_stages=2)
    launch_gemm(q, w1, cfg, s, s1, None, buf[:, :f], up=(w3, s3))
    assert not buf[:, :f].isnan().any() and buf[:, f:].isnan().all()
    assert rel_err(buf[:, :f], _pair_f64(q, s, w1, s1, w3, s3)) <= 1e-5


@pytest.mark.parametrize("smooth", [False, True])
def test_swiglu_w8a8_pair_every_path(smooth, gen):
    """The public entry: one quantization (with the shared smoothing vector), the fused kernel on triton-int8 (bit
    for bit the pair kernel launched directly on the same quantized operands with the config it picked), labelled
    fallbacks; every path near float64; the registry records each projection's site with how the pair ran."""
    from comfyui_ideogram4_int8.kernels import tuning

    m, f, k = 23, 96, 160
    x, w1, s1, w3, s3, sm = _pair_operands(m, f, k, gen, smooth)
    q, s = K.quantize_per_token_ref(x.float(), sm)
    ref = _pair_f64(q, s, w1, s1, w3, s3)
    before = (launches("gate_up_pair"), launches("gemm_triton"), launches("quant_triton"))
    h = K.swiglu_w8a8_pair(
        x.reshape(1, m, k),
        w1,
        s1,
        w3,
        s3,
        smooth=sm,
        path="triton-int8",
        site=("pair/layers.0.feed_forward.w1", "pair/layers.0.feed_forward.w3"),
    )
    assert (launches("gate_up_pair"), launches("gemm_triton"), launches("quant_triton")) == tuple(
        b + 1 for b in before
    ), "one quantization and one fused GEMM"
    assert h.shape == (1, m, f) and h.dtype == torch.bfloat16
    qt, st = K.quantize_per_token(x, sm)  # the quantizer the entry ran
    cfg, _ = tuning.PICKER.pick(qt, w1, None, epilogue=tuning.EPILOGUE_PAIR, n=2 * f)
    direct = torch.full((m, f), float("nan"), dtype=torch.bfloat16)
    launch_gemm(qt, w1, cfg, st, s1, None, direct, up=(w3, s3))
    assert torch.equal(h[0], direct), f"seed {gen.initial_seed()}"
    assert rel_err(h[0], ref) <= 1e-2 and cosine(h[0], ref) >= 0.9999
    recs = {r.layer: r for r in K.REGISTRY.layers("pair")}
    for name in ("layers.0.feed_forward.w1", "layers.0.feed_forward.w3"):
        r = recs[name]
        assert (r.path, r.n, r.k, r.m_last) == ("triton-int8", f, k, m) and r.config and r.fusion
        assert "one GEMM with the SwiGLU epilogue" in r.fusion
    for path in ("cublas-int8", "dequant-bf16"):
        y = K.swiglu_w8a8_pair(x, w1, s1, w3, s3, smooth=sm, path=path, site=f"pair/{path}", out_dtype=torch.float32)
        rec = next(r for r in K.REGISTRY.layers("pair") if r.layer == path)
        assert rec.path == path and rec.n == 2 * f and "forced" in rec.reason and "two" in rec.fusion
        assert y.dtype == torch.float32 and rel_err(y, ref) <= (1e-5 if path == "cublas-int8" else 2e-2), path


def test_swiglu_w8a8_pair_rejects_bad_operands(gen):
    x, w1, s1, w3, s3, _ = _pair_operands(4, 32, 64, gen)
    with pytest.raises(K.KernelInputError, match="one shape"):
        K.swiglu_w8a8_pair(x, w1, s1, w3[:16], s3[:16])
    with pytest.raises(K.KernelInputError, match="w3 must be a 2-D int8"):
        K.swiglu_w8a8_pair(x, w1, s1, w3.float(), s3)
    with pytest.raises(K.KernelInputError, match="x must be float"):
        K.swiglu_w8a8_pair(x[:, :32], w1, s1, w3, s3)
    with pytest.raises(K.KernelInputError, match="s3"):
        K.swiglu_w8a8_pair(x, w1, s1, w3, s3[:8])
    with pytest.raises(K.GemmPathUnavailable):
        K.swiglu_w8a8_pair(x, w1, s1, w3, s3, path="fastest")


def test_gate_up_pair_tuning_key_has_its_own_epilogue(monkeypatch):
    """The pair's picks are keyed by the GEMM it computes (N = 2F, epilogue 'swiglu-pair'), the shipped ones too."""
    from comfyui_ideogram4_int8.kernels import tuning

    h100 = "NVIDIA H100 80GB HBM3"
    cfg, source = tuning.shipped_config("sm90", h100, "3.6", 4608, 24576, 4608, epilogue=tuning.EPILOGUE_PAIR)
    assert cfg.kernel == "gluon-ws" and cfg.block_n == 256 and source == f"shipped table ({h100}, Triton 3.6)"
    assert tuning.shipped_config("sm90", h100, "3.6", 4608, 12288, 4608, epilogue=tuning.EPILOGUE_PAIR) is None
    picker = tuning.ConfigPicker()
    q, w1 = torch.zeros(300, 64, dtype=torch.int8), torch.zeros(96, 64, dtype=torch.int8)
    cfg, source = picker.pick(q, w1, None, epilogue=tuning.EPILOGUE_PAIR, n=192)
    assert source == "heuristic" and cfg.split_k == 1 and cfg.problem(2, swiglu=True) is None
    (entry,) = picker.picks()
    assert (entry["N"], entry["K"], entry["epilogue"]) == (192, 64, "swiglu-pair")
    assert tuning._disk_key(("sm90", "G", "3.6", 192, 64, 512, "swiglu-pair")).endswith("|swiglu-pair")


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


# -- GEMM timing (the panel's per-path milliseconds) ------------------------------------------------


class _Depth:
    """Stand-in for REGISTRY.timed on the CPU: counts how deep inside timed regions the code is."""

    def __init__(self):
        self.depth = 0
        self.entered: list[str] = []

    def __call__(self, path, device):
        import contextlib

        @contextlib.contextmanager
        def region():
            self.entered.append(path)
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1

        return region()


@pytest.mark.parametrize("entry", ["w8a8_linear", "swiglu_w8a8_pair"])
def test_timing_covers_the_launch_not_the_autotuning(entry, gen, monkeypatch):
    """A shape's first call may autotune (many trial launches): only the real launch counts as GEMM time."""
    from comfyui_ideogram4_int8.kernels import gemm_triton, tuning

    depth = _Depth()
    monkeypatch.setattr(K.REGISTRY, "timed", depth)
    launch_depths: list[int] = []
    real_launch = gemm_triton.launch_gemm

    def counting_launch(*args, **kwargs):
        launch_depths.append(depth.depth)
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(gemm_triton, "launch_gemm", counting_launch)
    trials = 2 + int(gen.initial_seed() % 3)
    real_pick = tuning.PICKER.pick

    def autotuning_pick(q, w, launch=None, **key):  # what _autotune does on a GPU: time trials
        cfg, _ = real_pick(q, w, None, **key)
        for _ in range(trials):
            launch(cfg)
        return cfg, "autotuned (test)"

    monkeypatch.setattr(tuning.PICKER, "pick", autotuning_pick)
    x = activations(5, 64, gen)
    if entry == "w8a8_linear":
        w, ws = weight(48, 64, gen)
        K.w8a8_linear(x, w, ws, path="triton-int8", site="timingtest/a")
    else:
        K.swiglu_w8a8_pair(x, *weight(32, 64, gen), *weight(32, 64, gen), path="triton-int8", site="timingtest/p")
    assert launch_depths == [0] * trials + [1]  # trials untimed, the launch timed (once, not nested)
    assert depth.entered and set(depth.entered) == {"triton-int8"}
    # unfused paths are timed as a whole, under their own path
    depth.entered.clear()
    K.w8a8_linear(x, *weight(48, 64, gen), path="cublas-int8", site="timingtest/c")
    assert depth.entered == ["cublas-int8"]


class _FakeCudaEvent:
    """torch.cuda.Event on a CPU machine: records a fake clock."""

    clock = 0.0

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = _FakeCudaEvent.clock

    def elapsed_time(self, end):
        return end.t - self.t


def test_untimed_run_keeps_the_last_timed_result(gen, monkeypatch):
    from comfyui_ideogram4_int8.kernels.registry import GemmRegistry

    monkeypatch.setattr(torch.cuda, "Event", _FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    reg = GemmRegistry()
    reg.enable_timing(True)
    cuda = torch.device("cuda")
    ms = [0.5 + float(v) for v in torch.rand(2, generator=gen)]
    reg.begin_run()
    for path, dt in zip(("triton-int8", "bf16"), ms, strict=True):
        with reg.timed(path, cuda):
            _FakeCudaEvent.clock += dt
    first = reg.end_run()
    assert first["triton-int8"] == pytest.approx(ms[0]) and first["bf16"] == pytest.approx(ms[1])
    wall = reg.last_run()["wall_ms"]
    # a run with nothing timed (timing switched off, or GEMMs on the CPU) leaves the timed result in place
    reg.enable_timing(False)
    reg.begin_run()
    with reg.timed("triton-int8", cuda):
        _FakeCudaEvent.clock += 9.0
    assert reg.end_run() == first
    reg.enable_timing(True)
    reg.begin_run()
    with reg.timed("triton-int8", torch.device("cpu")):
        pass
    reg.end_run()
    assert reg.last_run() == {"gemm_ms_per_path": first, "wall_ms": wall}
    # the next timed run replaces it
    reg.begin_run()
    with reg.timed("cublas-int8", cuda):
        _FakeCudaEvent.clock += 2.0
    assert reg.end_run()["cublas-int8"] == pytest.approx(2.0)
    assert reg.last_run()["gemm_ms_per_path"]["triton-int8"] == 0.0


@pytest.mark.parametrize("block_m", [1, 2])
@pytest.mark.parametrize("k,block_k,tail_k", [(4608, 4096, 512), (12288, 8192, 4096), (1500, 1024, 512), (96, 64, 32)])
def test_quantize_one_pass_with_tail_tile_identical_to_twin(k, block_k, tail_k, block_m, gen):
    """The one-pass quantizer holding a row as a BLOCK_K tile plus a TAIL_K tile (exact split and a
    masked remainder): same bytes and scales as the twin, zero and NaN rows included. BLOCK_M = 1
    keeps the row's absmax, inv and ok as scalars (the GPU default), BLOCK_M = 2 as vectors."""
    from comfyui_ideogram4_int8.kernels.quant_triton import quantize_rows_triton

    x = activations(6, k, gen, dtype=torch.bfloat16)
    x[1] = 0
    x[2, k - 1] = float("nan")
    smooth = torch.rand(k, generator=gen) + 0.5
    for sm in (None, smooth):
        params = dict(BLOCK_M=block_m, BLOCK_K=block_k, ONE_PASS=True, TAIL_K=tail_k, num_warps=4)
        q, s = quantize_rows_triton(x, sm, params)
        qr, sr = K.quantize_per_token_ref(x, sm)
        assert torch.equal(q, qr)
        assert torch.equal(s.nan_to_num(-1.0), sr.nan_to_num(-1.0)) and s[1] == 0 and s[2].isnan()


# -- ConvRot inside the quantizer (int8_convrot files) ----------------------------------------------


@pytest.mark.parametrize("m,k,group", [(1, 512, 256), (37, 4608, 256), (18, 256, 16), (5, 48, 16)])
def test_rotating_quantizer_matches_its_twin(m, k, group, gen):
    check_rotated_quantizer(m, k, group, gen)


@pytest.mark.parametrize("path", ["triton-int8", "cublas-int8", "dequant-bf16"])
def test_convrot_linear_vs_float64_of_the_unrotated_weight(path, gen):
    """A ConvRot weight (W rotated along K) with the activation rotated in the quantizer gives x W^T."""
    m, n, k, group = 23, 48, 512, 256
    x = activations(m, k, gen, dtype=torch.bfloat16)
    w_float = torch.randn(n, k, generator=gen) * 0.05
    wq, ws = K.quantize_weight_ref(K.reference.rotate_ref(w_float, group))
    bias = torch.randn(n, generator=gen)
    y = K.w8a8_linear(x, wq, ws, bias, path=path, site=f"convrot/{path}", convrot_group=group)
    ref = x.double() @ w_float.double().t() + bias.double()
    assert rel_err(y, ref) < 3e-2 and cosine(y, ref) > 0.999, f"{path} seed {gen.initial_seed()}"
    q, s = K.quantize_per_token(x, convrot_group=group)
    exact = reference_f64(q, s, wq, ws, bias)
    if path != "dequant-bf16":  # the same quantized operands: only the epilogue's rounding remains
        assert rel_err(y, exact) < 1e-2, path


def test_other_convrot_groups_rotate_then_quantize_and_bad_ones_are_named(gen):
    x = activations(9, 128, gen)
    before = launches("quant_rotated_triton")
    q, s = K.quantize_per_token(x, convrot_group=64)  # not a fused group size: rotation, then the plain kernel
    assert launches("quant_rotated_triton") == before
    qr, sr = K.quantize_per_token_ref(K.reference.rotate_ref(x, 64))
    assert torch.equal(q, qr) and torch.equal(s, sr)
    with pytest.raises(K.KernelInputError, match="power of 4"):
        K.quantize_per_token(x, convrot_group=32)
    with pytest.raises(K.KernelInputError, match="not a multiple of the ConvRot group size 256"):
        K.quantize_per_token(x, convrot_group=256)


@pytest.mark.parametrize("path", ["triton-int8", "cublas-int8", "dequant-bf16"])
def test_gate_up_pair_rotates_convrot_activations_once_in_its_quantizer(path, gen):
    """The gate/up pair of an int8_convrot file: one rotating quantization for both projections gives what the two
    ConvRot linears give (bit for bit on the unfused paths; the fused epilogue's float32 op order otherwise)."""
    m, f, k, group = 19, 64, 512, 256
    x = activations(m, k, gen, dtype=torch.bfloat16)
    (w1, s1), (w3, s3) = weight(f, k, gen), weight(f, k, gen)
    before = launches("quant_rotated_triton")
    h = K.swiglu_w8a8_pair(x, w1, s1, w3, s3, path=path, site=f"pairrot/{path}", convrot_group=group)
    if path == "triton-int8":
        assert launches("quant_rotated_triton") == before + 1  # one rotating quantization for both
    g = K.w8a8_linear(x, w1, s1, path=path, out_dtype=torch.float32, convrot_group=group)
    u = K.w8a8_linear(x, w3, s3, path=path, out_dtype=torch.float32, convrot_group=group)
    want = (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
    if path == "triton-int8":
        assert rel_err(h, want) < 1e-2, f"seed {gen.initial_seed()}"
    else:
        assert torch.equal(h, want), f"seed {gen.initial_seed()}"
