"""Kernel correctness on a CUDA GPU at full Ideogram 4 shapes (run on an H100/H200)."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels import gemm_triton
from kernel_checks import (
    IDEOGRAM_SHAPES,
    M_COND,
    M_TEXT,
    M_UNCOND,
    activations,
    check_quantize_edge_rows,
    cosine,
    int8,
    launches,
    reference_f64,
    rel_err,
    weight,
)

pytestmark = pytest.mark.cuda

FULL = [
    ("qkv", M_COND),
    ("o", M_COND),
    ("w1", M_UNCOND),
    ("w2", M_COND),
    ("adaln_modulation", 1),
    ("llm_cond_proj", M_TEXT),
    ("input_proj", M_UNCOND),
]


@pytest.mark.parametrize("name,m", FULL, ids=[f[0] for f in FULL])
def test_full_shape_int32_bit_exact(name, m, gen):
    n, k = IDEOGRAM_SHAPES[name]
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    out = torch.full((m, n), -(2**31) + 7, dtype=torch.int32, device="cuda")
    before = launches("gemm_triton")
    K.int8_matmul_int32(q, w, out=out)
    assert launches("gemm_triton") == before + 1
    qp = q if m > 16 else torch.cat([q, q.new_zeros(17 - m, k)])
    assert torch.equal(out, torch._int_mm(qp, w.t())[:m]), f"seed {gen.initial_seed()}"


@pytest.mark.parametrize("m", [1, 17, 333])
@pytest.mark.parametrize("n,k", [(200, 4608), (1000, 12288), (4608, 53248)])
def test_odd_m_bit_exact(m, n, k, gen):
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    got = K.int8_matmul_int32(q, w)
    qp = q if m > 16 else torch.cat([q, q.new_zeros(17 - m, k)])  # cuBLASLt wants M > 16
    assert torch.equal(got, torch._int_mm(qp, w.t())[:m])


@pytest.mark.parametrize("name,m", FULL, ids=[f[0] for f in FULL])
def test_full_shape_w8a8_linear_vs_float64(name, m, gen):
    n, k = IDEOGRAM_SHAPES[name]
    x = activations(m, k, gen, dtype=torch.bfloat16, device="cuda")
    w, ws = weight(n, k, gen, device="cuda")
    bias = torch.randn(n, generator=gen).cuda()
    smooth = (torch.rand(k, generator=gen) * 2 + 0.5).cuda()
    site = f"gpu/{name}"
    y = K.w8a8_linear(x, w, ws, bias, smooth=smooth, site=site)  # automatic path choice
    assert K.REGISTRY.path_of(site) == "triton-int8", "the fused path must be the automatic choice on sm_80+"
    q, s = K.quantize_per_token_ref(x, smooth)
    ref = reference_f64(q, s, w, ws, bias)
    assert rel_err(y, ref) <= 1e-2 and cosine(y, ref) >= 0.9999, f"seed {gen.initial_seed()}"
    # the twin of the same quantized operands in float32 output: the accumulator is exact, the
    # epilogue may differ by an ulp (the GPU fuses scale * x + bias into one FMA)
    y32 = K.int8_matmul(q, w, s, ws, bias, out_dtype=torch.float32)
    t32 = K.int8_matmul_ref(q, w, s, ws, bias, out_dtype=torch.float32)
    assert rel_err(y32, t32) <= 1e-6


@pytest.mark.parametrize("m,k", [(M_COND, 4608), (M_UNCOND, 12288), (M_TEXT, 53248), (333, 4608)])
@pytest.mark.parametrize("smooth", [False, True])
def test_full_shape_quantize_identical_to_twin(m, k, smooth, gen):
    x = activations(m, k, gen, dtype=torch.bfloat16, device="cuda")
    x[5] = 0
    sm = (torch.rand(k, generator=gen) * 4 + 0.25).cuda() if smooth else None
    before = launches("quant_triton")
    q, s = K.quantize_per_token(x, sm)
    assert launches("quant_triton") == before + 1
    qr, sr = K.quantize_per_token_ref(x, sm)
    assert torch.equal(q, qr) and torch.equal(s, sr), f"seed {gen.initial_seed()}"


def test_split_k_llm_cond_proj_bit_exact(gen):
    m, (n, k) = M_TEXT, IDEOGRAM_SHAPES["llm_cond_proj"]
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    expect = torch._int_mm(q, w.t())
    for split in (1, 2, 4, 8):
        out = torch.full((m, n), 3, dtype=torch.int32, device="cuda")
        gemm_triton.launch_gemm(q, w, C.GemmConfig(128, 128, 128, 8, split, 4, 3), out=out, raw_int32=True)
        assert torch.equal(out, expect), f"split_k={split}"


def test_hopper_configs_emit_wgmma_and_small_m_emits_mma_sync(gen):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("wgmma exists on sm_90 only")
    m, n, k = 256, 256, 512
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    out = torch.empty(m, n, dtype=torch.int32, device="cuda")
    gemm_triton.launch_gemm(q, w, C.GemmConfig(128, 128, 128, 8, 1, 4, 3), out=out, raw_int32=True)
    ptx = gemm_triton.LAST_LAUNCH["kernel"].asm["ptx"]
    assert "wgmma.mma_async" in ptx and ".s8.s8" in ptx
    # the Ampere instruction path, which Hopper compiles for BLOCK_M < 64
    gemm_triton.launch_gemm(q, w, C.GemmConfig(32, 128, 128, 1, 1, 4, 3), out=out, raw_int32=True)
    ptx = gemm_triton.LAST_LAUNCH["kernel"].asm["ptx"]
    assert "mma.sync" in ptx and "wgmma" not in ptx
    assert torch.equal(out, torch._int_mm(q, w.t()))


def test_fallback_paths_on_gpu(gen):
    n, k, m = 4608, 4608, 300
    x = activations(m, k, gen, dtype=torch.bfloat16, device="cuda")
    w, ws = weight(n, k, gen, device="cuda")
    q, s = K.quantize_per_token_ref(x)
    ref = reference_f64(q, s, w, ws)
    for path in ("cublas-int8", "dequant-bf16"):
        y = K.w8a8_linear(x, w, ws, path=path, site=f"gpufb/{path}")
        assert K.REGISTRY.path_of(f"gpufb/{path}") == path
        assert rel_err(y, ref) <= 2e-2 and cosine(y, ref) >= 0.9999, path


def test_every_config_of_this_gpu_bit_exact(gen):
    """Each config the autotuner may pick (incl. persistent / split-K / small-M) is exact."""
    from comfyui_ideogram4_int8.kernels.env import arch_name

    arch = arch_name(torch.cuda.get_device_capability())
    smem = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    m, n, k = 300, 1000, 4608
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    expect = torch._int_mm(q, w.t())
    seen = set()
    for mm in (16, 300):
        for cfg in C.config_space(arch, mm, smem):
            if cfg in seen:
                continue
            seen.add(cfg)
            out = torch.full((m, n), -(2**31) + 7, dtype=torch.int32, device="cuda")
            gemm_triton.launch_gemm(q, w, cfg, out=out, raw_int32=True)
            assert torch.equal(out, expect), cfg.key()
    assert len(seen) >= 10


def _gemm_direct_launches() -> int:
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    launchers = [gemm_triton._PERSISTENT, gemm_triton._GEMM, *gemm_gluon._LAUNCHERS.values()]
    return sum(fl.direct_launches for fl in launchers)


def test_fast_launch_reuses_compiled_kernels_and_stays_exact(gen):
    """Second and later calls skip Triton's binder (FastLauncher): same results, and a changed
    signature (misaligned operand, other M) misses the cache and is still exact."""
    from comfyui_ideogram4_int8.kernels import quant_triton

    m, (n, k) = M_COND, IDEOGRAM_SHAPES["o"]
    x = activations(m + 1, k, gen, torch.bfloat16, "cuda")
    wq, ws = weight(n, k, gen, "cuda")
    bias = torch.randn(n, generator=gen).cuda()
    first = K.w8a8_linear(x[:m], wq, ws, bias, path="triton-int8")
    quant0 = quant_triton._LAUNCH.direct_launches
    gemm0 = _gemm_direct_launches()
    again = K.w8a8_linear(x[:m], wq, ws, bias, path="triton-int8")
    assert quant_triton._LAUNCH.direct_launches == quant0 + 1
    assert _gemm_direct_launches() == gemm0 + 1
    assert torch.equal(first, again)
    # x[1:] is 2-byte misaligned: a new signature, so Triton's own path compiles a fitting kernel
    flat = x.reshape(-1)[1 : 1 + m * k].reshape(m, k)
    shifted = K.w8a8_linear(flat, wq, ws, bias, path="triton-int8")
    ref = reference_f64(*K.quantize_per_token(flat), wq, ws, bias)
    assert rel_err(shifted, ref) < 1e-2 and cosine(shifted, ref) > 0.9999
    for rows in (m, 333, 17):
        y = K.w8a8_linear(x[:rows], wq, ws, bias, path="triton-int8")
        ref = reference_f64(*K.quantize_per_token(x[:rows]), wq, ws, bias)
        assert rel_err(y, ref) < 1e-2 and cosine(y, ref) > 0.9999, rows


def test_split_k_workspace_bit_exact_every_split(gen):
    """Split-K partial slices summed by the epilogue kernel: exact for uneven K splits too."""
    m, (n, k) = M_TEXT, IDEOGRAM_SHAPES["llm_cond_proj"]
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    expect = torch._int_mm(q, w.t())
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") / 100
    for split in (2, 3, 7, 11):
        cfg = C.GemmConfig(128, 128, 128, 8, split, 4, 3)
        out = torch.full((m, n), 123, dtype=torch.int32, device="cuda")
        gemm_triton.launch_gemm(q, w, cfg, out=out, raw_int32=True)
        assert torch.equal(out, expect), f"split_k={split}"
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_triton.launch_gemm(q, w, cfg, sa, sb, None, y)
        ref = ((expect.double() * sa.double()[:, None]) * sb.double()[None, :]).float()
        assert rel_err(y, ref) < 1e-2 and not y.isnan().any(), f"split_k={split}"


@pytest.mark.parametrize("mode", [1, 2])
def test_gluon_kernel_runs_and_matches_float64(mode, gen):
    """The Hopper Gluon kernels (cooperative / ping-pong) at a full Ideogram shape with bias:
    poisoned output fully written, float64 agreement, and the Gluon kernel (not a fallback) ran."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    if gemm_gluon.gluon_available(torch.device("cuda")) is not None:
        pytest.skip(gemm_gluon.gluon_available(torch.device("cuda")))
    m, (n, k) = M_COND, IDEOGRAM_SHAPES["o"]
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w, ws = weight(n, k, gen, "cuda")
    bias = torch.randn(n, generator=gen).cuda()
    q, s = K.quantize_per_token(x)
    cfg = C.G(mode, 128, 256 if mode == 1 else 128, 4 if mode == 1 else 5)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_gluon.LAST_LAUNCH.clear()
    gemm_triton.launch_gemm(q, w, cfg, s, ws, bias, out)
    assert "kernel" in gemm_gluon.LAST_LAUNCH  # the Gluon launcher ran
    ref = reference_f64(q, s, w, ws, bias)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2 and cosine(out, ref) > 0.9999
    acc = torch.empty(m, n, dtype=torch.int32, device="cuda")
    gemm_triton.launch_gemm(q, w, cfg, out=acc, raw_int32=True)
    assert torch.equal(acc, torch._int_mm(q, w.t()))


@pytest.mark.parametrize("m", [M_TEXT, 333, 77])
def test_gluon_split_k_bit_exact_and_fully_written(m, gen):
    """Gluon split-K (ws 128x256 / pingpong 128x128, 11 splits; the split_add form that
    TMA-reduce-adds the partials into one zeroed sum; its balanced work lists) at llm_cond_proj:
    int32 sums bit-exact
    (sentinel poison: every workspace slice and output element written, rows past M clipped inside
    their slice), bf16 + bias against float64 (NaN poison)."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    if gemm_gluon.gluon_available(torch.device("cuda")) is not None:
        pytest.skip(gemm_gluon.gluon_available(torch.device("cuda")))
    n, k = IDEOGRAM_SHAPES["llm_cond_proj"]
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    expect = torch._int_mm(q, w.t())
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") / 100
    bias = torch.randn(n, generator=gen).cuda()
    configs = [C.G(1, 128, 256, 4, split_k=s) for s in (11, 6)] + [C.G(2, 128, 128, 5, split_k=11)]
    configs += [C.G(1, 128, 256, 4, split_k=5, split_add=1), C.G(2, 128, 128, 5, split_k=11, split_add=1)]
    configs += [C.G(1, 128, 256, 4, split_k=5, split_add=1, n256=1)]
    # balanced per-CTA work lists (SPLIT_MODE 2), with the n = 256 rewrite (the shipped H100 pick) and without
    configs += [C.G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=2)]
    configs += [C.G(1, 128, 256, 4, split_k=5, split_add=1, sched=3)]
    for cfg in configs:
        for _ in range(2):  # the second call runs the cached plan
            out = torch.full((m, n), -(2**31) + 7, dtype=torch.int32, device="cuda")
            gemm_gluon.LAST_LAUNCH.clear()
            gemm_triton.launch_gemm(q, w, cfg, out=out, raw_int32=True)
            assert "kernel" in gemm_gluon.LAST_LAUNCH
            assert torch.equal(out, expect), cfg.key()
            _assert_n256_ran(cfg, gemm_gluon.LAST_LAUNCH["kernel"])
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_triton.launch_gemm(q, w, cfg, sa, sb, bias, y)
        ref = (expect.double() * sa.double()[:, None]) * sb.double()[None, :] + bias.double()[None, :]
        assert not y.isnan().any() and rel_err(y, ref) < 1e-2 and cosine(y, ref) > 0.9999, cfg.key()


def _assert_n256_ran(cfg, kernel):
    """An n256 config ran the rewritten PTX (one m64n256k32 per k32 step), any other the compiled one."""
    ptx = kernel.asm["ptx"]
    if cfg.n256:
        assert kernel.metadata.ir_override and "m64n256k32.s32.s8.s8" in ptx and "m64n128k32" not in ptx, cfg.key()
    else:
        assert not kernel.metadata.ir_override and "m64n256k32" not in ptx, cfg.key()


@pytest.mark.parametrize("m,n", [(M_COND, 13824), (M_UNCOND, 4608), (77, 4624)])
def test_gluon_n256_rewrite_bit_exact(m, n, gen):
    """The n = 256 wgmma rewrite (cooperative 128x256 and ping-pong 64x256) at Ideogram shapes and an odd
    one: int32 bit-exact vs torch._int_mm (sentinel poison), the rewritten kernel really ran, and the
    whole W8A8 linear is bit-identical to the same config without the rewrite."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    if gemm_gluon.gluon_available(torch.device("cuda")) is not None:
        pytest.skip(gemm_gluon.gluon_available(torch.device("cuda")))
    k = 4608
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    expect = torch._int_mm(q, w.t())
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") / 100
    bias = torch.randn(n, generator=gen).cuda().bfloat16()
    for cfg in (C.G(1, 128, 256, 4, n256=1), C.G(2, 64, 256, 4, n256=1)):
        out = torch.full((m, n), -(2**31) + 7, dtype=torch.int32, device="cuda")
        gemm_triton.launch_gemm(q, w, cfg, out=out, raw_int32=True)
        assert torch.equal(out, expect), cfg.key()
        _assert_n256_ran(cfg, gemm_gluon.LAST_LAUNCH["kernel"])
        plain = C.GemmConfig(**{**cfg.as_dict(), "n256": 0})
        y = [torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        gemm_triton.launch_gemm(q, w, cfg, sa, sb, bias, y[0])
        gemm_triton.launch_gemm(q, w, plain, sa, sb, bias, y[1])
        _assert_n256_ran(plain, gemm_gluon.LAST_LAUNCH["kernel"])
        assert not y[0].isnan().any() and torch.equal(y[0], y[1]), cfg.key()


def test_gluon_pick_falls_back_where_tma_cannot_address_and_says_so(gen, monkeypatch):
    """A Gluon pick on operands TMA cannot address (K % 16 != 0) runs the Triton kernel, exactly,
    and the registry records the config that ran with the reason."""
    from comfyui_ideogram4_int8.kernels import autotune

    m, n, k = 300, 512, 4600  # K % 16 != 0
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w, ws = weight(n, k, gen, "cuda")
    monkeypatch.setattr(autotune.PICKER, "pick", lambda *a, **kw: (C.G(1, 128, 256, 4), "test pin"))
    y = K.w8a8_linear(x, w, ws, path="triton-int8", site="gluonfb/x")
    rec = next(r for r in K.REGISTRY.layers("gluonfb") if r.layer == "x")
    assert not rec.config.startswith("gluon") and "Triton persistent kernel ran" in rec.config_source
    ref = reference_f64(*K.quantize_per_token(x), w, ws)
    assert rel_err(y, ref) < 1e-2 and cosine(y, ref) > 0.9999


def test_n256_rewrite_refused_runs_the_compiled_kernel_and_says_so(gen, monkeypatch):
    """When the PTX does not match the n = 256 rewrite's pattern, the kernel runs as Triton compiled it
    (two n = 128 halves), exactly, and the registry records the config without n256 and the reason."""
    from comfyui_ideogram4_int8.kernels import autotune, gemm_gluon, wgmma_n256

    if gemm_gluon.gluon_available(torch.device("cuda")) is not None:
        pytest.skip(gemm_gluon.gluon_available(torch.device("cuda")))

    def refuse(ptx, row_bytes=128):
        raise wgmma_n256.MergeError("test: pattern not found")

    monkeypatch.setattr(wgmma_n256, "merge_n128_pairs", refuse)
    m, n, k = 208, 768, 2048  # a shape no other test builds a plan for
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w, ws = weight(n, k, gen, "cuda")
    cfg = C.G(1, 128, 256, 4, n256=1)
    monkeypatch.setattr(autotune.PICKER, "pick", lambda *a, **kw: (cfg, "test pin"))
    try:
        y = K.w8a8_linear(x, w, ws, path="triton-int8", site="n256fb/x")
        _assert_n256_ran(C.GemmConfig(**{**cfg.as_dict(), "n256": 0}), gemm_gluon.LAST_LAUNCH["kernel"])
        rec = next(r for r in K.REGISTRY.layers("n256fb") if r.layer == "x")
        assert rec.config.startswith("gluon") and "_n256" not in rec.config, rec.config
        assert "n=256 wgmma rewrite not applied: test: pattern not found" in rec.config_source
        ref = reference_f64(*K.quantize_per_token(x), w, ws)
        assert rel_err(y, ref) < 1e-2 and cosine(y, ref) > 0.9999
    finally:
        gemm_gluon.N256_FALLBACKS.pop(cfg.gluon_config().key(), None)


@pytest.mark.parametrize("m", [M_COND, 333])
def test_gluon_swiglu_epilogue_matches_float64_and_triton(m, gen):
    """The fused gate/up GEMM on the Gluon kernel: every output element written (NaN poison),
    float64 agreement, and the same result as the Triton SwiGLU epilogue."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    if gemm_gluon.gluon_available(torch.device("cuda")) is not None:
        pytest.skip(gemm_gluon.gluon_available(torch.device("cuda")))
    f, k = (12288, 4608) if m == M_COND else (1280, 4608)
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w1, s1 = weight(f, k, gen, "cuda")
    w3, s3 = weight(f, k, gen, "cuda")
    w13, s13 = K.interleave_gate_up(w1, s1, w3, s3, 128)
    q, s = K.quantize_per_token(x)
    outs = {}
    for name, cfg in (("gluon", C.G(1, 128, 256, 4)), ("triton", C.GemmConfig(128, 256, 128, 16, 1, 8, 3, 1, 0, 1))):
        out = torch.full((m, f), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_gluon.LAST_LAUNCH.clear()
        gemm_triton.launch_gemm(q, w13, cfg, s, s13, None, out, swiglu=True)
        assert ("kernel" in gemm_gluon.LAST_LAUNCH) == (name == "gluon")
        assert not out.isnan().any(), name
        outs[name] = out
    g = reference_f64(q, s, w1, s1)
    u = reference_f64(q, s, w3, s3)
    ref = g * torch.sigmoid(g) * u
    assert rel_err(outs["gluon"], ref) < 1e-2 and cosine(outs["gluon"], ref) > 0.9999
    assert rel_err(outs["gluon"], outs["triton"].double()) < 1e-3


@pytest.mark.parametrize("k", [4608, 12288, 53248])
def test_quantize_edge_rows_on_gpu_identical_to_twin(k, gen):
    """The edge rows (kernel_checks.check_quantize_edge_rows) at every Ideogram activation width,
    through the GPU kernel's conversion path."""
    check_quantize_edge_rows(k, gen, "cuda", torch.bfloat16)
