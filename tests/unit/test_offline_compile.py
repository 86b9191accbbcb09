"""The kernels compile for real NVIDIA targets on this machine's Triton, with no GPU: the offline compile
(tests/offline_compile.py, in its own process, as CI's compile matrix runs it on every Triton of the
supported matrix), and the Gluon host rules (in process, nothing compiled)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from comfyui_ideogram4_int8.kernels import backends
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels.env import arch_name
from offline_compile import ARCHS, SMEM_LIMIT, ptxas_present

TESTS = pathlib.Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(
    backends.triton_import_error() is not None, reason=str(backends.triton_import_error())
)


def _quick_compile(tmp_path: pathlib.Path, *archs: str) -> list[dict]:
    """The rows of ``offline_compile.py --quick`` for ``archs``, in a process of its own (no interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(TESTS / "offline_compile.py"), "--quick", "--arch", *archs]
    out = subprocess.run(
        [*cmd, "--json", str(tmp_path / "rows.json")], capture_output=True, text=True, env=env, timeout=1200
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return json.loads((tmp_path / "rows.json").read_text())


@needs_triton
@pytest.mark.skipif(not ptxas_present(), reason="triton's bundled ptxas not found")
def test_one_config_per_kernel_family_compiles_for_sm80_and_sm90a(tmp_path):
    rows = _quick_compile(tmp_path, "80", "90")
    ok = [r for r in rows if r["status"] == "OK"]
    kernels = {r["case"].split("/")[0] for r in ok if r["case"][0] in "tg"}
    assert {"triton", "triton-tma"} <= kernels  # triton-tma compiles for sm_90 only
    # the SwiGLU gate/up pair from two weights: the pointer kernel everywhere, the persistent TMA kernel on sm_90a
    pairs = {(r["cc"], r["case"].split("/")[0]) for r in ok if r["case"].endswith("[swiglu-pair]")}
    assert {(80, "triton"), (90, "triton"), (90, "triton-tma")} <= pairs
    gemms80 = [r for r in ok if r["cc"] == 80 and r["case"].startswith("triton/") and not r["case"].endswith("reduce")]
    assert gemms80 and all(r["mma"] == "mma.sync" for r in gemms80)
    hopper = [
        r for r in ok if r["cc"] == 90 and r["case"].startswith(("triton-tma", "gluon")) and "reduce" not in r["case"]
    ]
    assert hopper and all(r["mma"] == "wgmma" and r["wgmma"] == "m64n128k32" for r in hopper)
    assert all(r["smem"] <= 227 * 1024 and r["tma"] != "0L/0S" for r in hopper)
    if backends.gluon_import_error() is None:
        assert {"gluon-ws", "gluon-pingpong"} <= kernels
        gluon = [r for r in ok if r["case"].startswith("gluon")]
        assert any("/sk" in r["case"] for r in gluon)
        assert {r["case"].split("/")[0] for r in gluon if r["case"].endswith("[swiglu-pair]")} == {
            "gluon-ws",
            "gluon-pingpong",
        }
        assert all(r["regs"] == 168 for r in gluon)  # the launch cap of the 12-warp warp-specialized kernel


@needs_triton
@pytest.mark.skipif(not ptxas_present(), reason="triton's bundled ptxas not found")
def test_one_config_per_kernel_family_compiles_for_consumer_and_datacenter_blackwell(tmp_path):
    """sm_120: Ada's mma.sync tiles within its ~99 KB, no TMA or wgmma kernel; sm_100: the datacenter space (the
    persistent TMA kernel too) on int8 tensor cores (tcgen05 or mma.sync, as this Triton line lowers it); both: the
    fp8 GEMM on e4m3 tensor cores wherever the pack runs it on this Triton line."""
    from comfyui_ideogram4_int8.kernels import fp8_gemm
    from comfyui_ideogram4_int8.kernels.env import triton_line

    rows = _quick_compile(tmp_path, "100", "120")
    assert all(r["status"] == "OK" for r in rows), [r for r in rows if r["status"] != "OK"]
    gemms = {cc: [r for r in rows if r["cc"] == cc and r["case"].startswith("triton")] for cc in (100, 120)}
    mains = {cc: [r for r in g if not r["case"].endswith("reduce")] for cc, g in gemms.items()}
    assert mains[120] and all(r["mma"] == "mma.sync" and r["smem"] <= 99 * 1024 for r in mains[120])
    assert not any(r["case"].startswith("triton-tma") for r in gemms[120])
    assert any(r["case"].startswith("triton-tma") for r in mains[100])
    assert all(r["mma"] in ("tcgen05", "mma.sync") and r["smem"] <= 227 * 1024 for r in mains[100])
    for cc in (100, 120):
        fp8 = [r for r in rows if r["cc"] == cc and r["case"].startswith("fp8 GEMM")]
        runs = fp8_gemm.fp8_tile_problem(arch_name((cc // 10, cc % 10)), triton_line()) is None
        assert bool(fp8) == runs and all(r["mma"] == "e4m3" for r in fp8), (cc, fp8)


def test_the_offline_compile_covers_every_family_within_its_limit():
    """Every family with a config space is compiled for, against the limit the pack itself prunes with."""
    from comfyui_ideogram4_int8.kernels.configs import CONFIG_SPACES
    from comfyui_ideogram4_int8.kernels.configs import SMEM_LIMIT as FAMILY_LIMIT

    assert {arch_name((cc // 10, cc % 10)) for cc in ARCHS} == set(CONFIG_SPACES)
    assert all(SMEM_LIMIT[cc] == FAMILY_LIMIT[arch_name((cc // 10, cc % 10))] for cc in ARCHS)


def test_the_offline_compile_refuses_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, str(TESTS / "offline_compile.py"), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 2 and "TRITON_INTERPRET" in out.stderr


# -- Gluon host rules (build_launch validates before anything compiles) ---------------------------


def _gluon():
    try:
        from comfyui_ideogram4_int8.kernels import gemm_gluon
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"gemm_gluon does not import: {exc}")
    if gemm_gluon.IMPORT_ERROR:
        pytest.skip(gemm_gluon.IMPORT_ERROR)
    return gemm_gluon


def _operands(M=300, N=512, K=1024, out_dtype=torch.bfloat16):
    q = torch.zeros(M, K, dtype=torch.int8)
    w = torch.zeros(N, K, dtype=torch.int8)
    return q, w, torch.ones(M), torch.ones(N), torch.empty(M, N, dtype=out_dtype)


WS = C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4)
PP = C.GemmConfig("gluon-pingpong", 128, 128, 128, num_stages=5)


def test_gluon_launch_shape_and_register_cap():
    G = _gluon()
    q, w, sa, sb, out = _operands()
    kernel, grid, args, kwargs = G.build_launch(q, w, sa, sb, torch.zeros(512), out, WS, num_sms=132)
    assert grid == (min(132, 3 * 2),) and kwargs["num_warps"] == 4 and kwargs["maxnreg"] == 168
    assert kwargs["PINGPONG"] is False and kwargs["SPLIT_K"] == 1 and kwargs["INSTR_N"] == 128
    assert list(args[3].block_shape) == [64, 64]  # each consumer warpgroup stores its 64 rows
    _, _, args, kwargs = G.build_launch(q, w, sa, sb, None, out, PP, num_sms=132)
    assert kwargs["PINGPONG"] is True and list(args[3].block_shape) == [128, 64]


def test_gluon_operand_problems_name_the_operand():
    """The Gluon kernel's operand check (pure Python: no Gluon needed); the device question is not asked there."""
    from comfyui_ideogram4_int8.kernels.operands import gluon_operand_problem

    q, w, sa, sb, out = _operands(K=1000)
    assert "multiple of 16" in gluon_operand_problem(WS, q, w, out)
    q, w, sa, sb, out = _operands(K=1040)
    assert "TMA cannot address" in gluon_operand_problem(WS, q[:, 8:1032], w[:, 8:1032], out)  # base 8 bytes off
    q, w, sa, sb, out = _operands()
    assert gluon_operand_problem(WS, q, w, out) is None
    w3 = torch.zeros(512, 1040, dtype=torch.int8)[:, 8:1032]  # the up weight of a pair, 8 bytes off
    assert "TMA cannot address" in gluon_operand_problem(WS, q, w, out, up=(w3, sb))
    assert "no bias" in gluon_operand_problem(WS, q, w, out, bias=sb, up=(w.clone(), sb))
    q, w, sa, sb, out = _operands(N=514, K=53248)
    split = C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4, split_k=5)
    assert "multiple of 4" in gluon_operand_problem(split, q, w, out)


def test_gluon_gate_up_pair_epilogue_launch_rules():
    """The SwiGLU epilogue of the gate/up pair at F = 256 (out [300, 256], two 128-row halves per B tile)."""
    G = _gluon()
    q, w1, sa, s1, out = _operands(N=256)
    w3, s3 = torch.zeros(256, 1024, dtype=torch.int8), torch.ones(256)
    kernel, grid, args, kwargs = G.build_launch(q, w1, sa, s1, None, out, WS, num_sms=132, up=(w3, s3))
    assert kwargs["PAIR"] is True and kwargs["EPI_BUFS"] == 2  # 128 columns out: 2 subtiles of 64
    assert list(args[3].shape) == [300, 256] and list(args[3].block_shape) == [64, 64]
    full = torch.empty(300, 512, dtype=torch.bfloat16)
    for bad in (
        dict(out=full),  # out must be [M, F]
        dict(bias=torch.zeros(256)),  # no bias
        dict(cfg=C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=3, epi_n=256)),  # a subtile straddles halves
        dict(cfg=C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4, split_k=5)),  # no split-K
    ):
        a = dict(q=q, w=w1, q_scale=sa, w_scale=s1, bias=None, out=out, cfg=WS) | bad
        with pytest.raises(ValueError):
            G.build_launch(**a, num_sms=132, up=(w3, s3))
    # F no multiple of BLOCK_N // 2: TMA zero-fills and clips, so the pair takes it
    G.build_launch(
        q,
        w1[:192],
        sa,
        s1[:192],
        None,
        torch.empty(300, 192, dtype=torch.bfloat16),
        WS,
        num_sms=132,
        up=(w3[:192], s3[:192]),
    )
    assert C.gluon_epi_bufs(C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=3, epi_n=128), 2, swiglu=True) == 1


def test_gluon_gate_up_pair_launch_rules():
    """The SwiGLU gate/up pair from two weights: two weight descriptors of half a B tile each (one B tile, shared
    memory ring and wgmma shape as a linear of width BLOCK_N), the up scales, out [M, F]; misuse refused."""
    G = _gluon()
    M, F, K = 300, 320, 1024  # F is no multiple of the tile: TMA zero-fills and clips, scale loads are masked
    q, w1, sa, s1, out = _operands(M, F, K)
    w3, s3 = torch.zeros(F, K, dtype=torch.int8), torch.ones(F)
    kernel, grid, args, kwargs = G.build_launch(q, w1, sa, s1, None, out, WS, num_sms=132, up=(w3, s3))
    assert kwargs["PAIR"] is True and kwargs["INSTR_N"] == 128
    assert args[1].base is w1 and args[2].base is w3 and list(args[1].block_shape) == list(args[2].block_shape)
    assert list(args[1].block_shape) == [128, 128] and args[1].layout == args[2].layout
    assert args[5] is s1 and args[6] is s3 and list(args[3].shape) == [M, F] and list(args[3].block_shape) == [64, 64]
    assert grid == (min(132, 3 * 3),)  # 3 x cdiv(320, 128) tiles
    # the linear launch hands the gate descriptor in for the unread up one
    _, _, args, kwargs = G.build_launch(q, w1, sa, s1, None, out, WS, num_sms=132)
    assert kwargs["PAIR"] is False and args[2] is args[1]
    for bad in (
        dict(up=(w3[:, :512], s3)),  # another shape
        dict(up=(w3.float(), s3)),  # not int8
        dict(bias=torch.zeros(F)),  # no bias
        dict(out=torch.empty(M, F // 2, dtype=torch.bfloat16)),  # out [M, F]
        dict(cfg=C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4, split_k=5)),  # no split-K
    ):
        a = dict(q=q, w=w1, q_scale=sa, w_scale=s1, bias=None, out=out, cfg=WS, up=(w3, s3)) | bad
        with pytest.raises(ValueError):
            G.build_launch(**a, num_sms=132)


def test_portable_gate_up_pair_launch_rules():
    """The portable kernels' gate/up pair: the pointer kernel for ``triton`` (and for ``triton-tma`` where TMA cannot
    address an operand), the persistent TMA kernel otherwise; misuse refused before anything compiles."""
    from comfyui_ideogram4_int8.kernels import gemm_triton as T

    M, F, K = 300, 320, 1024
    q, w1, sa, s1, out = _operands(M, F, K)
    w3, s3 = torch.zeros(F, K, dtype=torch.int8), torch.ones(F)
    ptr = C.GemmConfig("triton", 64, 128, 64)
    ((kernel, grid, args, _),) = T.build_launches(q, w1, ptr, sa, s1, None, out, up=(w3, s3))
    assert kernel is T._gate_up_kernel and grid == (5 * 5,)  # cdiv(300, 64) x cdiv(320, 64)
    tma = C.GemmConfig("triton-tma", 64, 128, 64)
    ((kernel, grid, args, _),) = T.build_launches(q, w1, tma, sa, s1, None, out, up=(w3, s3), num_sms=7)
    assert kernel is T._gate_up_persistent_kernel and grid == (7,) and list(args[1].block_shape) == [64, 64]
    ((kernel, _, _, _),) = T.build_launches(q[:, 1:1001], w1[:, 1:1001], tma, sa, s1, None, out, up=(w3[:, 1:1001], s3))
    assert kernel is T._gate_up_kernel  # misaligned rows: the pointer kernel with the same tile
    for bad in (
        dict(up=(w3[:200], s3[:200])),
        dict(bias=torch.zeros(F)),
        dict(raw_int32=True),
        dict(cfg=C.GemmConfig("triton", 64, 128, 64, split_k=2)),
        dict(q_scale=None),
    ):
        a = dict(q=q, w=w1, cfg=ptr, q_scale=sa, w_scale=s1, bias=None, out=out, up=(w3, s3)) | bad
        with pytest.raises(ValueError):
            T.build_launches(**a)


def test_gluon_split_k_plan_and_workspace():
    G = _gluon()
    cfg = C.GemmConfig("gluon-ws", 128, 256, 128, num_stages=4, split_k=11)
    assert C.split_plan(cfg, 53248) == (38, 11)  # 416 k steps: 10 x 38 + 36
    assert C.split_plan(cfg, 4608) == (4, 9)  # 36 k steps: never an empty split
    assert C.split_plan(cfg, 128) == (1, 1)
    M, N, K = 333, 512, 53248  # M not a multiple of the tile
    q, w, sa, sb, out = _operands(M, N, K)
    with pytest.raises(ValueError):  # split-K needs the workspace
        G.build_launch(q, w, sa, sb, None, out, cfg, num_sms=132)
    with pytest.raises(ValueError):  # of exactly [S, M, N]
        G.build_launch(q, w, sa, sb, None, out, cfg, ws=torch.empty(11, 336, N, dtype=torch.int32), num_sms=132)
    ws = torch.empty(11, M, N, dtype=torch.int32)
    with pytest.raises(ValueError):  # int32
        G.build_launch(q, w, sa, sb, None, out, cfg, ws=ws.float(), num_sms=132)
    kernel, grid, args, kwargs = G.build_launch(q, w, sa, sb, torch.zeros(N), out, cfg, ws=ws, num_sms=132)
    # a 3-D descriptor over ws: a tile's rows past M are clipped inside its own slice
    assert list(args[3].shape) == [11, M, N] and list(args[3].block_shape) == [1, 64, 64] and args[3].base is ws
    assert args[11] == 38 and kwargs["SPLIT_K"] == 11 and kwargs["RAW_INT32"] is True and kwargs["HAS_BIAS"] is False
    assert grid == (min(132, 3 * 2 * 11),)  # units = tiles x splits
