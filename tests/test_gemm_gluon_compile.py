"""The Gluon Hopper GEMM on the CPU: host-side checks, and an offline sm_90a compile (no GPU:
triton.compile with the wheel's ptxas) whose PTX must hold int8 wgmma, TMA and mbarriers."""

from __future__ import annotations

import pathlib

import pytest
import torch
from comfyui_ideogram4_int8.kernels import gemm_gluon as G

needs_gluon = pytest.mark.skipif(G._IMPORT_ERROR is not None, reason=str(G._IMPORT_ERROR))


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
