"""Kernel correctness on a CUDA GPU at full Ideogram 4 shapes (run on an H100/H200)."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends, gemm_triton, settings, tuning
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels.fused import launch_config
from kernel_checks import (
    IDEOGRAM_SHAPES,
    M_COND,
    M_TEXT,
    M_UNCOND,
    activations,
    check_quantize_edge_rows,
    check_rotated_quantizer,
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
        gemm_triton.launch_gemm(q, w, C.GemmConfig("triton", 128, 128, 128, split_k=split), out=out, raw_int32=True)
        assert torch.equal(out, expect), f"split_k={split}"


def test_hopper_configs_emit_wgmma_and_small_m_emits_mma_sync(gen):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("wgmma exists on sm_90 only")
    m, n, k = 256, 256, 512
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    out = torch.empty(m, n, dtype=torch.int32, device="cuda")
    gemm_triton.launch_gemm(q, w, C.GemmConfig("triton", 128, 128, 128), out=out, raw_int32=True)
    ptx = gemm_triton.LAST_LAUNCH["kernel"].asm["ptx"]
    assert "wgmma.mma_async" in ptx and ".s8.s8" in ptx
    # the Ampere instruction path, which Hopper compiles for BLOCK_M < 64
    gemm_triton.launch_gemm(q, w, C.GemmConfig("triton", 32, 128, 128, group_m=1), out=out, raw_int32=True)
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
    """Each config the autotuner may pick on this GPU and Triton (Gluon, TMA, split-K, small-M) is exact and
    ran the kernel it names."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon
    from comfyui_ideogram4_int8.kernels.env import arch_name

    arch = arch_name(torch.cuda.get_device_capability())
    smem = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    m, n, k = 300, 1000, 4608
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    expect = torch._int_mm(q, w.t())
    seen = set()
    for mm in (16, 300):
        for cfg in C.config_space(arch, mm, smem, backends.runnable_kernels(torch.device("cuda"))):
            if cfg in seen:
                continue
            seen.add(cfg)
            out = torch.full((m, n), -(2**31) + 7, dtype=torch.int32, device="cuda")
            gemm_gluon.LAST_LAUNCH.clear()
            launch_config(cfg, q, w, None, None, None, out, True)
            assert torch.equal(out, expect), cfg.key()
            assert ("kernel" in gemm_gluon.LAST_LAUNCH) == cfg.is_gluon, cfg.key()
    assert len(seen) >= 10


def test_repeated_and_misaligned_calls_stay_exact(gen):
    """Later calls reuse compiled kernels; a changed signature (misaligned operand, other M) compiles a
    fitting kernel and is still exact."""
    m, (n, k) = M_COND, IDEOGRAM_SHAPES["o"]
    x = activations(m + 1, k, gen, torch.bfloat16, "cuda")
    wq, ws = weight(n, k, gen, "cuda")
    bias = torch.randn(n, generator=gen).cuda()
    from comfyui_ideogram4_int8.kernels import launch

    first = K.w8a8_linear(x[:m], wq, ws, bias, path="triton-int8")
    cached = sum(lc.cached_launches for lc in launch._LAUNCHERS.values())
    assert torch.equal(first, K.w8a8_linear(x[:m], wq, ws, bias, path="triton-int8"))
    if launch.fast_launch_unavailable() is None:  # the quantizer and the GEMM relaunched from the cache
        assert sum(lc.cached_launches for lc in launch._LAUNCHERS.values()) == cached + 2, launch.status()
    # x[1:] is 2-byte misaligned: a new signature (and no TMA for the Gluon pick: its portable twin runs)
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
        cfg = C.GemmConfig("triton", 128, 128, 128, split_k=split)
        out = torch.full((m, n), 123, dtype=torch.int32, device="cuda")
        gemm_triton.launch_gemm(q, w, cfg, out=out, raw_int32=True)
        assert torch.equal(out, expect), f"split_k={split}"
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_triton.launch_gemm(q, w, cfg, sa, sb, None, y)
        ref = ((expect.double() * sa.double()[:, None]) * sb.double()[None, :]).float()
        assert rel_err(y, ref) < 1e-2 and not y.isnan().any(), f"split_k={split}"


def _needs_gluon():
    why = backends.unavailable("gluon", torch.device("cuda"))
    if why:
        pytest.skip(why)


WS = C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4)
PP = C.GemmConfig("gluon-pingpong", 128, 128, 128, num_stages=5)


@pytest.mark.parametrize("cfg", [WS, PP], ids=lambda c: c.kernel)
def test_gluon_kernel_runs_and_matches_float64(cfg, gen):
    """The Hopper Gluon kernels (cooperative / ping-pong) at a full Ideogram shape with bias:
    poisoned output fully written, float64 agreement, and the Gluon kernel (not a fallback) ran."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    _needs_gluon()
    m, (n, k) = M_COND, IDEOGRAM_SHAPES["o"]
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w, ws = weight(n, k, gen, "cuda")
    bias = torch.randn(n, generator=gen).cuda()
    q, s = K.quantize_per_token(x)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_gluon.LAST_LAUNCH.clear()
    launch_config(cfg, q, w, s, ws, bias, out, False)
    assert "kernel" in gemm_gluon.LAST_LAUNCH  # the Gluon launcher ran
    ref = reference_f64(q, s, w, ws, bias)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2 and cosine(out, ref) > 0.9999
    acc = torch.empty(m, n, dtype=torch.int32, device="cuda")
    launch_config(cfg, q, w, None, None, None, acc, True)
    assert torch.equal(acc, torch._int_mm(q, w.t()))


@pytest.mark.parametrize("m", [M_TEXT, 333, 77])
def test_gluon_split_k_bit_exact_and_fully_written(m, gen):
    """Gluon split-K (cooperative 128x256 and ping-pong 128x128; 5, 6 and 11 splits) at llm_cond_proj:
    int32 sums bit-exact (sentinel poison: every workspace slice and output element written, rows past M
    clipped inside their slice), bf16 + bias against float64 (NaN poison)."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    _needs_gluon()
    n, k = IDEOGRAM_SHAPES["llm_cond_proj"]
    q, w = int8((m, k), gen, "cuda"), int8((n, k), gen, "cuda")
    expect = torch._int_mm(q, w.t())
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") / 100
    bias = torch.randn(n, generator=gen).cuda()
    configs = [C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4, split_k=s) for s in (5, 6, 11)]
    configs += [C.GemmConfig("gluon-pingpong", 128, 128, 128, num_stages=5, split_k=s) for s in (4, 11)]
    for cfg in configs:
        out = torch.full((m, n), -(2**31) + 7, dtype=torch.int32, device="cuda")
        gemm_gluon.LAST_LAUNCH.clear()
        launch_config(cfg, q, w, None, None, None, out, True)
        assert "kernel" in gemm_gluon.LAST_LAUNCH
        assert torch.equal(out, expect), cfg.key()
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch_config(cfg, q, w, sa, sb, bias, y, False)
        ref = (expect.double() * sa.double()[:, None]) * sb.double()[None, :] + bias.double()[None, :]
        assert not y.isnan().any() and rel_err(y, ref) < 1e-2 and cosine(y, ref) > 0.9999, cfg.key()


def test_gluon_pick_falls_back_where_tma_cannot_address_and_says_so(gen, monkeypatch):
    """A Gluon pick on operands TMA cannot address (K % 16 != 0) runs its portable twin, exactly,
    and the registry records the config that ran with the reason."""
    m, n, k = 300, 512, 4600  # K % 16 != 0
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w, ws = weight(n, k, gen, "cuda")
    monkeypatch.setattr(tuning.PICKER, "pick", lambda *a, **kw: (WS, "test pin"))
    y = K.w8a8_linear(x, w, ws, path="triton-int8", site="gluonfb/x")
    rec = next(r for r in K.REGISTRY.layers("gluonfb") if r.layer == "x")
    assert rec.config == C.portable_twin(WS).key() and "the portable Triton kernel ran" in rec.config_source
    ref = reference_f64(*K.quantize_per_token(x), w, ws)
    assert rel_err(y, ref) < 1e-2 and cosine(y, ref) > 0.9999


@pytest.fixture
def clean_demotions():
    backends.DEMOTIONS.clear()
    yield
    backends.DEMOTIONS.clear()


@pytest.mark.parametrize("name,m", [("qkv", M_COND), ("w2", M_UNCOND), ("llm_cond_proj", M_TEXT)])
def test_forced_gluon_compile_failure_gives_the_portable_result_exactly(name, m, gen, monkeypatch, clean_demotions):
    """A Gluon kernel that fails to compile: the call gives bit for bit what the portable kernel gives for the
    same tile, the shape is demoted once (the Gluon launch is not retried), the registry names the reason."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    _needs_gluon()
    n, k = IDEOGRAM_SHAPES[name]
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w, ws = weight(n, k, gen, "cuda")
    bias = torch.randn(n, generator=gen).cuda().bfloat16()
    cfg, _ = tuning.PICKER.pick(torch.empty(m, k, dtype=torch.int8, device="cuda"), w)
    assert cfg.is_gluon, f"the shipped pick for {name} is {cfg.key()}"
    q, s = K.quantize_per_token(x)
    expect = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch_config(C.portable_twin(cfg), q, w, s, ws, bias, expect, False)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("test: triton.compiler.errors.CompilationError: async_copy_global_to_shared removed")

    monkeypatch.setattr(gemm_gluon, "launch_gemm", broken)
    for _ in range(2):
        y = K.w8a8_linear(x, w, ws, bias, path="triton-int8", site=f"gluonbroken/{name}")
        assert torch.equal(y, expect), f"seed {gen.initial_seed()}"
    assert len(calls) == 1
    rec = next(r for r in K.REGISTRY.layers("gluonbroken") if r.layer == name)
    assert rec.path == "triton-int8" and rec.config == C.portable_twin(cfg).key()
    assert "Gluon kernel" in rec.config_source and "async_copy_global_to_shared removed" in rec.config_source


def test_forced_portable_failure_gives_the_cublas_result_exactly(gen, monkeypatch, setting, clean_demotions):
    """The portable kernel failing too (Gluon off): the call gives bit for bit the cublas-int8 path's result,
    the registry says cublas-int8 ran and why."""
    setting(settings.GLUON, "off")
    m, (n, k) = M_COND, IDEOGRAM_SHAPES["o"]
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w, ws = weight(n, k, gen, "cuda")
    bias = torch.randn(n, generator=gen).cuda().bfloat16()
    expect = K.w8a8_linear(x, w, ws, bias, path="cublas-int8", site="portablebroken/ref")

    def broken(*args, **kwargs):
        raise RuntimeError("test: out of resources: shared memory")

    monkeypatch.setattr(gemm_triton, "launch_gemm", broken)
    y = K.w8a8_linear(x, w, ws, bias, site="portablebroken/o")
    assert torch.equal(y, expect), f"seed {gen.initial_seed()}"
    rec = next(r for r in K.REGISTRY.layers("portablebroken") if r.layer == "o")
    assert rec.path == "cublas-int8" and "out of resources" in rec.reason


@pytest.mark.parametrize("m", [M_COND, 333])
def test_gluon_swiglu_epilogue_matches_float64_and_triton(m, gen):
    """The fused gate/up GEMM on the Gluon kernel: every output element written (NaN poison),
    float64 agreement, and bit for bit the result of the Triton SwiGLU epilogue (persistent TMA kernel)."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    _needs_gluon()
    f, k = (12288, 4608) if m == M_COND else (1280, 4608)
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w1, s1 = weight(f, k, gen, "cuda")
    w3, s3 = weight(f, k, gen, "cuda")
    q, s = K.quantize_per_token(x)
    outs = {}
    tma = C.GemmConfig("triton-tma", 128, 256, 128, group_m=16, num_warps=8, subtile=True)
    for name, cfg in (("gluon", WS), ("triton", tma)):
        out = torch.full((m, f), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_gluon.LAST_LAUNCH.clear()
        launch_config(cfg, q, w1, s, s1, None, out, False, up=(w3, s3))
        assert ("kernel" in gemm_gluon.LAST_LAUNCH) == (name == "gluon")
        assert not out.isnan().any(), name
        outs[name] = out
    g = reference_f64(q, s, w1, s1)
    u = reference_f64(q, s, w3, s3)
    ref = g * torch.sigmoid(g) * u
    assert rel_err(outs["gluon"], ref) < 1e-2 and cosine(outs["gluon"], ref) > 0.9999
    assert torch.equal(outs["gluon"], outs["triton"]), f"seed {gen.initial_seed()}"


@pytest.mark.parametrize("k", [4608, 12288, 53248])
def test_quantize_edge_rows_on_gpu_identical_to_twin(k, gen):
    """The edge rows (kernel_checks.check_quantize_edge_rows) at every Ideogram activation width,
    through the GPU kernel's conversion path."""
    check_quantize_edge_rows(k, gen, "cuda", torch.bfloat16)


@pytest.mark.parametrize("m,k", [(M_COND, 4608), (M_UNCOND, 12288), (1, 512), (333, 4608)])
def test_rotating_quantizer_on_gpu_matches_its_twin(m, k, gen):
    """ConvRot inside the quantizer at Ideogram 4's widths (group 256, as ComfyUI's int8_convrot files)."""
    check_rotated_quantizer(m, k, 256, gen, "cuda")


# -- SwiGLU gate/up pair read from two weights (w1 / w3 stay two [F, K] tensors) -------------------------------


def _pair(m, gen, f=12288, k=4608):
    x = activations(m, k, gen, torch.bfloat16, "cuda")
    w1, s1 = weight(f, k, gen, "cuda")
    w3, s3 = weight(f, k, gen, "cuda")
    return x, w1, s1.float(), w3, s3.float()


PAIR_GPU_CFGS = [
    WS,
    PP,
    C.GemmConfig("triton-tma", 128, 256, 128, group_m=16, num_warps=8),
    C.GemmConfig("triton", 128, 128, 128),
    C.GemmConfig("triton", 32, 128, 128, group_m=1, num_stages=3),  # mma.sync (the Ampere instruction path)
]
# a tile unlike every PAIR_GPU_CFGS one: the pair's result must not depend on the kernel or the tile
PAIR_GPU_REF = C.GemmConfig("triton", 64, 64, 64)


@pytest.mark.parametrize("m", [M_COND, M_UNCOND, 333, 17])
def test_gate_up_pair_full_shape_bit_exact_on_every_kernel(m, gen):
    """w1 / w3 [12288, 4608] as two tensors: every kernel family (Gluon cooperative and ping-pong where this GPU runs
    them, the persistent TMA kernel, the pointer kernel, an mma.sync tile) gives bit for bit the pointer kernel's
    output with another tile (the same exact int32 accumulators, the same float32 epilogue ops per element), writes
    every element (NaN poison), matches float64, and really ran (Gluon: its launcher ran a kernel with three TMA
    loads per stage: A, the w1 box, the w3 box)."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    x, w1, s1, w3, s3 = _pair(m, gen)
    q, s = K.quantize_per_token(x)
    ref = None
    gluon_ok = backends.unavailable("gluon", torch.device("cuda")) is None
    ran = []
    want = torch.full((m, 12288), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch_config(PAIR_GPU_REF, q, w1, s, s1, None, want, False, up=(w3, s3))
    for cfg in PAIR_GPU_CFGS:
        if cfg.is_gluon and not gluon_ok:
            continue
        if cfg.kernel == "triton-tma" and torch.cuda.get_device_capability() < (9, 0):
            continue
        got = torch.full((m, 12288), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_gluon.LAST_LAUNCH.clear()
        launch_config(cfg, q, w1, s, s1, None, got, False, up=(w3, s3))
        if cfg.is_gluon:
            ptx = gemm_gluon.LAST_LAUNCH["kernel"].asm["ptx"]
            assert ptx.count("cp.async.bulk.tensor.2d.shared") == 3, cfg.key()
        assert not got.isnan().any(), cfg.key()
        assert torch.equal(got, want), f"{cfg.key()} seed {gen.initial_seed()}"
        if ref is None:
            g = reference_f64(q, s, w1, s1)
            u = reference_f64(q, s, w3, s3)
            ref = g * torch.sigmoid(g) * u
        assert rel_err(got, ref) < 1e-2 and cosine(got, ref) > 0.9999, cfg.key()
        ran.append(cfg.kernel)
    assert "triton" in ran and (not gluon_ok or {"gluon-ws", "gluon-pingpong"} <= set(ran))


@pytest.mark.parametrize("m", [M_COND, M_UNCOND, 333, 17])
def test_swiglu_w8a8_pair_full_shape_automatic_path(m, gen):
    """The public entry at Ideogram's FFN shape: the automatic path is the fused pair kernel (one quantizer launch,
    one GEMM launch; Gluon at the token counts the shipped table covers, where this GPU and Triton run it), recorded
    under both projections' sites; the result is bit for bit the pair kernel's on the same quantized operands, and
    float64's."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon
    from comfyui_ideogram4_int8.kernels.env import triton_line

    x, w1, s1, w3, s3 = _pair(m, gen)
    sites = (f"gpupair{m}/layers.0.feed_forward.w1", f"gpupair{m}/layers.0.feed_forward.w3")
    before = (launches("gate_up_pair"), launches("quant_triton"))
    gemm_gluon.LAST_LAUNCH.clear()
    h = K.swiglu_w8a8_pair(x, w1, s1, w3, s3, site=sites)
    torch.cuda.synchronize()
    assert (launches("gate_up_pair"), launches("quant_triton")) == (before[0] + 1, before[1] + 1)
    recs = {r.layer: r for r in K.REGISTRY.layers(f"gpupair{m}")}
    rec = recs["layers.0.feed_forward.w1"]
    assert rec.path == "triton-int8" and rec.reason == "" and "one GEMM" in rec.fusion, rec
    assert recs["layers.0.feed_forward.w3"].config == rec.config
    shipped = m in (M_COND, M_UNCOND) and triton_line() == "3.6" and torch.cuda.get_device_capability() == (9, 0)
    if shipped and backends.unavailable("gluon", torch.device("cuda")) is None:
        assert rec.config.startswith("gluon-ws/128x256x128") and rec.config_source.startswith("shipped table")
        assert "kernel" in gemm_gluon.LAST_LAUNCH
    q, s = K.quantize_per_token(x)
    g = reference_f64(q, s, w1, s1)
    u = reference_f64(q, s, w3, s3)
    ref = g * torch.sigmoid(g) * u
    assert rel_err(h, ref) < 1e-2 and cosine(h, ref) > 0.9999, f"seed {gen.initial_seed()}"
    direct = torch.full((m, 12288), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch_config(PAIR_GPU_REF, q, w1, s, s1, None, direct, False, up=(w3, s3))
    assert torch.equal(h, direct), f"seed {gen.initial_seed()}"


def test_gate_up_pair_gluon_failure_runs_the_portable_pair_exactly(gen, monkeypatch, clean_demotions):
    """The Gluon pair kernel failing to compile: the call gives bit for bit the portable twin's pair result, the
    pair's shape is demoted (under its own epilogue key), the registry says why."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon

    _needs_gluon()
    x, w1, s1, w3, s3 = _pair(M_COND, gen)
    monkeypatch.setattr(tuning.PICKER, "pick", lambda *a, **kw: (WS, "test pin"))
    q, s = K.quantize_per_token(x)
    want = torch.full((M_COND, 12288), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch_config(C.portable_twin(WS, swiglu=True), q, w1, s, s1, None, want, False, up=(w3, s3))

    def broken(*args, **kwargs):
        raise RuntimeError("test: gluon pair kernel does not compile")

    monkeypatch.setattr(gemm_gluon, "launch_gemm", broken)
    h = K.swiglu_w8a8_pair(x, w1, s1, w3, s3, path="triton-int8", site="gpupairfb/w1")
    assert torch.equal(h, want)
    rec = next(r for r in K.REGISTRY.layers("gpupairfb"))
    assert rec.path == "triton-int8" and rec.config == C.portable_twin(WS, swiglu=True).key()
    assert "gluon pair kernel does not compile" in rec.config_source
    assert any(d["shape"][-1] == "swiglu-pair" for d in backends.DEMOTIONS.items())


@pytest.mark.parametrize("tokens", [4608, 4096, 1000])
def test_block_norms_on_the_gpu_match_torchs_unfused_ops(tokens):
    """The fused pre-norm and gated residual at Ideogram 4's width on the GPU against torch's own ops there (what
    ComfyUI's block runs) and float64 with the same roundings: equal but for rare one-ulp differences of the mean of
    squares; the Triton kernel ran."""
    gen = torch.Generator().manual_seed(tokens)
    c = 4608
    x = (torch.randn(1, tokens, c, generator=gen) * 2).bfloat16()
    x[..., 11] *= 80
    y = (torch.randn(1, tokens, c, generator=gen) * 4).bfloat16()
    w = (torch.rand(c, generator=gen) + 0.5).bfloat16()
    mod = (torch.randn(1, 1, 4 * c, generator=gen) * 0.5).bfloat16()
    x, y, w, mod = x.cuda(), y.cuda(), w.cuda(), mod.cuda()
    scale, gate = 1.0 + mod[..., :c], torch.tanh(mod[..., 2 * c : 3 * c])
    before = launches("rms_modulate_triton")
    pre = K.rms_norm_modulate(x, w, scale, 1e-5)
    res = K.rms_norm_gated_residual(x, y, w, gate, 1e-5)
    torch.cuda.synchronize()
    assert launches("rms_modulate_triton") == before + 2
    # torch's kernel may round the normalized row differently by one unit in the last place (another summation order
    # of the mean of squares, another product order): one ulp of a product's input is up to a few ulps of the
    # result; in the residual, of the larger term of the sum, which may cancel
    for got, twin, size in (
        (pre, K.rms_norm_modulate_ref(x, w, scale, 1e-5), None),
        (res, K.rms_norm_gated_residual_ref(x, y, w, gate, 1e-5), x),
    ):
        assert torch.isfinite(got).all()
        diff = (got.double() - twin.double()).abs()
        mag = twin.double().abs() if size is None else torch.maximum(twin.double().abs(), size.double().abs())
        spacing = torch.exp2(torch.floor(torch.log2(mag.clamp_min(2.0**-126)))) * torch.finfo(torch.bfloat16).eps
        assert (diff <= 4 * spacing).all(), (diff / spacing).max().item()  # 4.0 seen on an H100 (1 in ~10⁵ differ)
        assert (got != twin).float().mean().item() <= 1e-4


@pytest.mark.parametrize(
    ("b", "tokens", "c", "dtype"),
    [(1, 4608, 4608, torch.bfloat16), (1, 1000, 4608, torch.float16), (2, 300, 3000, torch.bfloat16)],
)
def test_the_pre_norms_handed_quantization_on_the_gpu_is_the_quantizers(b, tokens, c, dtype):
    """On the GPU (the compiled kernel, not the interpreter's arithmetic): the int8 rows and scales the pre-norm
    hands over are bit for bit what the quantizer kernel gives for its stored output: at Ideogram 4's width (a head
    and a tail tile) and at a width held as one masked tile, bf16 and fp16, a modulation vector per batch item, with
    an outlier channel, a zero row and a NaN row; the linear fed by it takes them and equals its own quantization's
    result; every warp count's rows are its own output's quantization, that output within one rounding of 4 warps'."""
    from comfyui_ideogram4_int8.kernels import handoff
    from comfyui_ideogram4_int8.kernels.quant_triton import quantize_rows_triton
    from comfyui_ideogram4_int8.kernels.rms_modulate_triton import rms_modulate_triton

    gen = torch.Generator().manual_seed(tokens + c)
    x = (torch.randn(b, tokens, c, generator=gen) * 2).to(dtype)
    x[..., 11] *= 80
    x[0, 3] = 0.0
    x[-1, 5, 7] = float("nan")
    w = (torch.rand(c, generator=gen) + 0.5).to(dtype)
    scale = (1.0 + torch.randn(b, 1, c, generator=gen) * 0.5).to(dtype)
    wq = torch.randint(-127, 128, (2048, c), generator=gen, dtype=torch.int8)
    ws = torch.rand(2048, generator=gen) * 1e-3
    x, w, scale, wq, ws = x.cuda(), w.cuda(), scale.cuda(), wq.cuda(), ws.cuda()
    handoff.clear()
    out = K.rms_norm_modulate(x, w, scale, 1e-5, hand_off=True)
    assert handoff.pending()
    q, s = handoff.claim(out.view(-1, c))
    want_q, want_s = quantize_rows_triton(out.view(-1, c))
    assert torch.equal(q, want_q) and torch.equal(s.nan_to_num(-1.0), want_s.nan_to_num(-1.0))
    assert s[3] == 0 and not q[3].any() and s[(b - 1) * tokens + 5].isnan()
    src, vec = x.view(-1, c), scale[:, 0, :]
    one = rms_modulate_triton(src, None, w, vec, tokens, 1e-5, True, num_warps=4)
    spacing = torch.exp2(torch.floor(torch.log2(one[0].double().nan_to_num(0.0).abs().clamp_min(2.0**-14))))
    spacing = spacing * torch.finfo(dtype).eps
    for warps in (2, 8, 16):
        # another warp count sums the row's squares in another order (a last-place change of the float32 mean): a
        # rounding of the normalized row may land on its neighbour, a few ulps of the output after the products (the
        # kernel keeps the unfused ops' roundings); its int8 rows are still its own output's quantization
        out_w, q_w, s_w = rms_modulate_triton(src, None, w, vec, tokens, 1e-5, True, num_warps=warps)
        diff = (out_w.double() - one[0].double()).nan_to_num(0.0).abs()
        assert (diff <= 4 * spacing).all() and (diff > 0).float().mean().item() <= 1e-3, (warps, (diff / spacing).max())
        assert torch.equal(out_w.isnan(), one[0].isnan()), warps
        want_q, want_s = quantize_rows_triton(out_w)
        assert torch.equal(q_w, want_q) and torch.equal(s_w.nan_to_num(-1.0), want_s.nan_to_num(-1.0)), warps
    finite = x.clone()
    finite[-1, 5, 7] = 1.0
    out = K.rms_norm_modulate(finite, w, scale, 1e-5, hand_off=True)
    handed = launches("quant_handoff")
    got = K.w8a8_linear(out, wq, ws)
    assert launches("quant_handoff") == handed + 1 and not handoff.pending()
    assert torch.equal(got, K.w8a8_linear(out.clone(), wq, ws))


@pytest.mark.parametrize(
    ("m", "k", "dtype"),
    [(4608, 12288, torch.bfloat16), (333, 4608, torch.float16), (77, 3000, torch.float32), (5, 53248, torch.bfloat16)],
)
def test_the_quantizers_fp8_codes_on_the_gpu_are_the_twins(m, k, dtype):
    """The compiled kernel's e4m3 codes (its hardware cvt, not the interpreter's grid rounding) and scales equal the
    twin's bit for bit, on the GPU and on the CPU: the protected w2's input, a head/tail row, two passes, long rows;
    outlier channels, a zero row, NaN, -inf and -0.0 entries."""
    from comfyui_ideogram4_int8.kernels.quant_triton import quantize_rows_triton

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("e4m3 codes need an Ada or Hopper GPU")
    gen = torch.Generator().manual_seed(m + k)
    x = torch.randn(m, k, generator=gen) * torch.randn(m, k, generator=gen).abs()
    x[:, :8] *= 300.0
    x[1] = 0.0
    x[2, 9] = float("nan")
    x[3, 4] = float("-inf")
    x[4, :16] = -0.0
    x = x.to(dtype)
    fp8 = torch.float8_e4m3fn
    q, s = quantize_rows_triton(x.cuda(), codes=fp8)
    for twin_q, twin_s in (K.quantize_per_token_ref(x.cuda(), codes=fp8), K.quantize_per_token_ref(x, codes=fp8)):
        assert torch.equal(q.view(torch.uint8).cpu(), twin_q.view(torch.uint8).cpu())
        assert torch.equal(s.nan_to_num(-1.0).cpu(), twin_s.nan_to_num(-1.0).cpu())
    assert s[1] == 0 and s[2].isnan() and s[3].isnan()


@pytest.mark.parametrize(
    ("m", "n", "k", "dtype"),
    [(4608, 4608, 12288, torch.bfloat16), (4096, 4608, 12288, torch.bfloat16), (333, 200, 1000, torch.float16)],
)
def test_the_fp8_path_is_the_float64_product_of_its_e4m3_operands_on_the_gpu(m, n, k, dtype):
    """``kernels.fp8_linear`` on the GPU (the protected w2 of both branches; an odd shape with a masked K tail):
    recorded as triton-fp8, the float64 product of the same e4m3 operands within Hopper's fp8 accumulation (it keeps
    fewer mantissa bits than float32: ~0.5% at K = 12288, the probe's measure), within fp8's own error of the
    unquantized product."""
    from kernel_checks import check_fp8_linear

    if torch.cuda.get_device_capability() not in ((8, 9), (9, 0)):
        pytest.skip("the triton-fp8 path runs on Ada and Hopper")
    gen = torch.Generator().manual_seed(m + n + k)
    err_same, err_exact = check_fp8_linear(m, n, k, gen, device="cuda", dtype=dtype, tol=1.5e-2)
    assert err_same < err_exact  # the kernel's own error is well below what e4m3 rounding costs
