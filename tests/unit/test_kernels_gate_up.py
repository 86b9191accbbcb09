"""The SwiGLU gate/up pair read from two weights on the CPU interpreter: bit-exact on every kernel and tile,
float64 at odd widths, every path."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm
from kernel_checks import activations, cosine, launches, reference_f64, rel_err, weight

pytestmark = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None,
    reason="Triton interpreter not available (needs triton + TRITON_INTERPRET=1)",
)


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
