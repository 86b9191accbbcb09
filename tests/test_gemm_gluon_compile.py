"""The Gluon Hopper GEMM on the CPU: host-side checks, and an offline sm_90a compile (no GPU:
triton.compile with the wheel's ptxas) whose PTX must hold int8 wgmma, TMA and mbarriers."""

from __future__ import annotations

import pathlib

import pytest
import torch
from comfyui_ideogram4_int8.kernels import gemm_gluon as G

needs_gluon = pytest.mark.skipif(G._IMPORT_ERROR is not None, reason=str(G._IMPORT_ERROR))


def _language_namespaces():
    import triton.language as tl

    return (tl, tl.core, tl.core.tensor, tl.math, tl.core.tensor_descriptor_base)


# Triton 3.6's interpreter patches triton.language builtins for every @jit helper call and never
# restores them (InterpretedFunction.__call__), so a real compile later in the same process can fail
# inside tl.cdiv. Snapshot the namespaces at collection (before any test runs a kernel on the
# interpreter) and put them back before each offline compile.
_PRISTINE = [(ns, dict(vars(ns))) for ns in _language_namespaces()]


@pytest.fixture(autouse=True)
def pristine_triton_language():
    for ns, saved in _PRISTINE:
        current = vars(ns)
        for name in [n for n in current if n not in saved]:
            delattr(ns, name)
        for name, value in saved.items():
            if current.get(name, value) is not value:
                setattr(ns, name, value)
    yield


def _ptxas_present() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return (pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


def _operands(M=300, N=520, K=1024, out_dtype=torch.bfloat16):
    q = torch.zeros(M, K, dtype=torch.int8)
    w = torch.zeros(N, K, dtype=torch.int8)
    return q, w, torch.ones(M), torch.ones(N), torch.zeros(N), torch.empty(M, N, dtype=out_dtype)


def test_probe_configs_are_valid():
    for cfg in G.PROBE_CONFIGS + (G.DEFAULT_CONFIG,):
        assert G.validate(cfg) is None, cfg
        assert cfg.smem_bytes(4) <= 227 * 1024


@pytest.mark.parametrize(
    "bad",
    [
        G.GluonGemmConfig(mode="nope"),
        G.GluonGemmConfig(block_m=64, mode="ws"),  # 32 rows per consumer warpgroup
        G.GluonGemmConfig(block_n=256, epi_n=96),
        G.GluonGemmConfig(num_stages=6),  # shared memory
    ],
)
def test_validate_rejects(bad):
    assert G.validate(bad) is not None


def test_gluon_unavailable_on_cpu():
    assert G.gluon_available(torch.device("cpu")) is not None


@needs_gluon
def test_launcher_refuses_what_tma_cannot_address():
    q, w, sa, sb, bias, out = _operands(K=1000)  # K % 16 != 0: int8 row stride not 16-byte aligned
    assert G.build_launch(q, w, sa, sb, bias, out, num_sms=132) is None
    q, w, sa, sb, bias, out = _operands()
    assert G.build_launch(q[:, 8:], w[:, 8:], sa, sb, bias, out, num_sms=132) is None  # misaligned base
    kernel, grid, args, kwargs = G.build_launch(q, w, sa, sb, bias, out, num_sms=132)
    assert grid == (min(132, 3 * 3),) and kwargs["num_warps"] == 4 and kwargs["maxnreg"] == 168


@needs_gluon
@pytest.mark.skipif(not _ptxas_present(), reason="triton's bundled ptxas not found")
@pytest.mark.parametrize("mode,raw", [("ws", False), ("pipelined", True), ("pingpong", False)])
def test_offline_sm90a_compile(mode, raw):
    from comfyui_ideogram4_int8.bench.compile_gluon_sm90 import compile_offline, ptx_stats

    cfg = {"ws": G.DEFAULT_CONFIG, "pipelined": G.GluonGemmConfig(mode="pipelined", num_stages=3)}.get(
        mode, G.GluonGemmConfig(mode="pingpong", block_n=128, num_stages=5)
    )
    q, w, sa, sb, bias, out = _operands(out_dtype=torch.int32 if raw else torch.bfloat16)
    kernel, grid, args, kwargs = G.build_launch(
        q, w, None if raw else sa, None if raw else sb, None if raw else bias, out, raw_int32=raw, cfg=cfg, num_sms=132
    )
    ck = compile_offline(kernel, args, kwargs)
    st = ptx_stats(ck.asm["ptx"])
    assert st["wgmma_shapes"] == ["wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"]
    assert st["tma_load"] >= 2 and st["tma_store"] >= 1 and st["mbarrier"] > 0
    if mode != "pipelined":  # producer warp shrinks, consumers grow
        assert "setmaxnreg.dec.sync.aligned.u32 40" in st["setmaxnreg"]
        assert "setmaxnreg.inc.sync.aligned.u32 232" in st["setmaxnreg"]
    assert "cubin" in ck.asm and ck.metadata.shared <= 227 * 1024


# -- SwiGLU epilogue: w13 [2F, K] holds gate/up rows interleaved in chunks of BLOCK_N // 2 -----


def _swiglu_operands(M=300, N=512, K=1024):
    q = torch.zeros(M, K, dtype=torch.int8)
    w = torch.zeros(N, K, dtype=torch.int8)
    return q, w, torch.ones(M), torch.ones(N), torch.empty(M, N // 2, dtype=torch.bfloat16)


@needs_gluon
def test_swiglu_launch_checks():
    q, w, sa, sb, out = _swiglu_operands()
    kernel, grid, args, kwargs = G.build_launch(q, w, sa, sb, None, out, num_sms=132, swiglu=True)
    assert kwargs["SWIGLU"] is True and kwargs["EPI_BUFS"] == 2  # 128 columns out: 2 subtiles of 64
    assert list(args[2].shape) == [300, 256] and list(args[2].block_shape) == [64, 64]  # c covers out [M, N / 2]
    full = torch.empty(300, 512, dtype=torch.bfloat16)
    assert G.build_launch(q, w, sa, sb, None, full, num_sms=132)[3]["SWIGLU"] is False
    with pytest.raises(ValueError):  # out must be [M, N / 2]
        G.build_launch(q, w, sa, sb, None, full, num_sms=132, swiglu=True)
    with pytest.raises(ValueError):  # no bias
        G.build_launch(q, w, sa, sb, torch.zeros(512), out, num_sms=132, swiglu=True)
    with pytest.raises(ValueError):  # N % BLOCK_N
        G.build_launch(q, w[:384], sa, sb, None, out[:, :192], num_sms=132, swiglu=True)
    raw = torch.empty(300, 256, dtype=torch.int32)
    with pytest.raises(ValueError):  # not raw_int32
        G.build_launch(q, w, None, None, None, raw, raw_int32=True, num_sms=132, swiglu=True)
    with pytest.raises(ValueError):  # misuse raises before the TMA test could return None
        G.launch_gemm_gluon(q, w, None, None, None, raw, raw_int32=True, swiglu=True)
    with pytest.raises(ValueError):  # a subtile would straddle gate and up
        G.build_launch(q, w, sa, sb, None, out, cfg=G.GluonGemmConfig(block_n=256, epi_n=256, num_stages=3),
                       num_sms=132, swiglu=True)  # fmt: skip
    # one subtile per half: one staging buffer per consumer (store_wait(0) before its reuse)
    assert G._epi_bufs(G.GluonGemmConfig(epi_n=128, num_stages=3), 2, swiglu=True) == 1


@needs_gluon
@pytest.mark.skipif(not _ptxas_present(), reason="triton's bundled ptxas not found")
@pytest.mark.parametrize("mode", ["ws", "pingpong", "pipelined"])
def test_offline_sm90a_compile_swiglu(mode):
    from comfyui_ideogram4_int8.bench.compile_gluon_sm90 import compile_offline, cubin_stats, ptx_stats

    cfg = {
        "ws": G.DEFAULT_CONFIG,
        "pingpong": G.GluonGemmConfig(mode="pingpong", block_m=64, block_n=256, num_stages=4),
        "pipelined": G.GluonGemmConfig(mode="pipelined", num_stages=3),
    }[mode]
    q, w, sa, sb, out = _swiglu_operands()
    kernel, grid, args, kwargs = G.build_launch(q, w, sa, sb, None, out, cfg=cfg, num_sms=132, swiglu=True)
    ck = compile_offline(kernel, args, kwargs)
    ptx = ck.asm["ptx"]
    st = ptx_stats(ptx)
    assert st["wgmma_shapes"] == ["wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"]
    assert st["tma_load"] >= 2 and st["tma_store"] >= 1 and st["mbarrier"] > 0
    assert "ex2.approx.f32" in ptx and "div.full.f32" in ptx  # sigmoid as tl.sigmoid lowers it
    if mode != "pipelined":
        assert "setmaxnreg.inc.sync.aligned.u32 232" in st["setmaxnreg"]
    assert "cubin" in ck.asm and ck.metadata.shared <= 227 * 1024
    cb = cubin_stats(ck.asm["cubin"])
    if "error" not in cb:
        assert cb["sass_spill_ops"] == 0 and cb.get("local", 0) == 0 and cb["sass_GMMA"] > 0


# -- split-K: int32 partials of tiles x splits units into ws [S, M, N], then the Triton reduce ------


@needs_gluon
def test_splitk_host_rules():
    from comfyui_ideogram4_int8.kernels.configs import G as gcfg

    cfg = G.GluonGemmConfig(mode="ws", num_stages=4, split_k=11)
    assert G.split_plan(cfg, 53248) == (38, 11)  # 416 k steps: 10 x 38 + 36
    assert G.split_plan(cfg, 4608) == (4, 9)  # 36 k steps: never an empty split
    assert G.split_plan(cfg, 128) == (1, 1) and G.workspace_shape(cfg, 77, 4608, 128) is None
    assert G.workspace_shape(cfg, 333, 4608, 53248) == (11, 333, 4608)
    assert "_sk11" in cfg.key() and "_sk" not in G.DEFAULT_CONFIG.key()
    assert G.validate(G.GluonGemmConfig(mode="pipelined", split_k=2)) is not None
    assert G.validate(G.GluonGemmConfig(mode="ws", split_k=0)) is not None
    for c in G.SPLITK_PROBE_CONFIGS:
        assert G.validate(c) is None, c

    M, N, K = 333, 512, 53248  # M not a multiple of the tile
    q, w, sa, sb, bias, out = _operands(M, N, K)
    with pytest.raises(ValueError):  # split-K needs the workspace
        G.build_launch(q, w, sa, sb, bias, out, cfg=cfg, num_sms=132)
    with pytest.raises(ValueError):  # of exactly [S, M, N]
        G.build_launch(q, w, sa, sb, bias, out, cfg=cfg, num_sms=132, ws=torch.empty(11, 336, N, dtype=torch.int32))
    ws = torch.empty(G.workspace_shape(cfg, M, N, K), dtype=torch.int32)
    kernel, grid, args, kwargs = G.build_launch(q, w, sa, sb, bias, out, cfg=cfg, num_sms=132, ws=ws)
    # 3-D descriptor over ws: a tile's rows past M are clipped inside its own slice
    assert list(args[2].shape) == [11, M, N] and list(args[2].block_shape) == [1, 64, 64]
    assert args[2].base is ws and args[9] == 38
    assert kwargs["SPLIT_K"] == 11 and kwargs["RAW_INT32"] is True and kwargs["HAS_BIAS"] is False
    assert grid == (min(132, 3 * 2 * 11),)  # units = tiles x splits
    with pytest.raises(ValueError):  # int32, contiguous
        G.build_launch(q, w, sa, sb, bias, out, cfg=cfg, num_sms=132, ws=ws.float())
    # unsplit launches keep the 2-D output descriptor and SPLIT_K 1
    _, _, args1, kwargs1 = G.build_launch(q, w, sa, sb, bias, out, num_sms=132)
    assert kwargs1["SPLIT_K"] == 1 and list(args1[2].block_shape) == [64, 64]

    sq, sw, ssa, ssb, sout = _swiglu_operands()
    with pytest.raises(ValueError):  # SwiGLU cannot run split-K
        G.build_launch(sq, sw, ssa, ssb, None, sout, cfg=cfg, num_sms=132, swiglu=True)
    with pytest.raises(ValueError):
        G.launch_gemm_gluon(sq, sw, ssa, ssb, None, sout, cfg=cfg, swiglu=True)

    gc = gcfg(1, 128, 256, 4, split_k=11)
    assert gc.gluon_config().split_k == 11 and gc.key().endswith("_sk11")
    assert gc.gluon_config() == G.GluonGemmConfig(mode="ws", num_stages=4, split_k=11, num_warps=4)


@needs_gluon
def test_split_add_host_rules():
    """split_add: one [1, M, N] workspace the units reduce-add into, started from zero."""
    from comfyui_ideogram4_int8.kernels.configs import G as gcfg

    cfg = G.GluonGemmConfig(mode="ws", num_stages=4, split_k=5, split_add=True)
    assert G.validate(cfg) is None and cfg.key().endswith("_sk5a")
    assert G.validate(G.GluonGemmConfig(mode="ws", split_add=True)) is not None  # needs split_k > 1
    assert G.workspace_shape(cfg, 333, 4608, 53248) == (1, 333, 4608)
    assert G.workspace_shape(cfg, 333, 4608, 128) is None  # one k step: not split
    M, N, K = 333, 512, 53248
    q, w, sa, sb, bias, out = _operands(M, N, K)
    with pytest.raises(ValueError):  # the slice workspace of plain split-K is the wrong shape
        G.build_launch(q, w, sa, sb, bias, out, cfg=cfg, num_sms=132, ws=torch.zeros(5, M, N, dtype=torch.int32))
    ws = torch.zeros(1, M, N, dtype=torch.int32)
    _, grid, args, kwargs = G.build_launch(q, w, sa, sb, bias, out, cfg=cfg, num_sms=132, ws=ws)
    assert kwargs["SPLIT_K"] == 5 and kwargs["SPLIT_MODE"] == 1 and grid == (min(132, 3 * 2 * 5),)
    assert list(args[2].shape) == [1, M, N] and args[2].base is ws
    plain = G.build_launch(q, w, sa, sb, bias, out, cfg=G.GluonGemmConfig(mode="ws", num_stages=4, split_k=5),
                           num_sms=132, ws=torch.empty(5, M, N, dtype=torch.int32))  # fmt: skip
    assert plain[3]["SPLIT_MODE"] == 0
    gc = gcfg(1, 128, 256, 4, split_k=5, split_add=1)
    assert gc.key().endswith("_sk5a") and gc.gluon_config() == cfg.__class__(**{**cfg.__dict__, "num_warps": 4})


@needs_gluon
@pytest.mark.skipif(not _ptxas_present(), reason="triton's bundled ptxas not found")
@pytest.mark.parametrize("idx", [0, 2, 8, 11])  # ws 128x256 sk11, pingpong 128x128 sk11, their split_add forms
def test_offline_sm90a_compile_splitk(idx):
    from comfyui_ideogram4_int8.bench.compile_gluon_sm90 import compile_splitk, cubin_stats, ptx_stats

    cfg = G.SPLITK_PROBE_CONFIGS[idx]
    (kernel, grid, args, kwargs), ck = compile_splitk(cfg, M=333)
    ptx = ck.asm["ptx"]
    st = ptx_stats(ptx)
    assert st["wgmma_shapes"] == ["wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8"]
    assert st["tma_load"] >= 2 and st["mbarrier"] > 0
    # the partials leave through the 3-D workspace descriptor only, as int32 (no dequant): stored
    # into their slice, or (split_add) reduce-added into the one sum, never both
    leave, other = ("tma_reduce_add", "tma_store") if cfg.split_add else ("tma_store", "tma_reduce_add")
    assert st[leave] >= cfg.block_n // cfg.epi_n and st[other] == 0
    if cfg.split_add:
        assert st[leave] == ptx.count("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add")
    else:
        assert st[leave] == ptx.count("cp.async.bulk.tensor.3d.global.shared")
    assert "cvt.rn.bf16" not in ptx
    assert "setmaxnreg.inc.sync.aligned.u32 232" in st["setmaxnreg"]
    assert "cubin" in ck.asm and ck.metadata.shared <= 227 * 1024
    cb = cubin_stats(ck.asm["cubin"])
    if "error" not in cb:
        assert cb["sass_spill_ops"] == 0 and cb.get("local", 0) == 0 and cb["sass_GMMA"] > 0
