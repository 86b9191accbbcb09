"""W8A8 GEMM for Hopper (sm_90a) written in Gluon: explicit TMA / mbarrier / async wgmma. This module is its
host side (launch planning: ``build_launch``; ``launch_gemm``): the kernel is in gemm_gluon_kernel.py, its device
helpers in gemm_gluon_device.py, the Gluon API names in gluon_api.py. Whether this device and Triton run it is
``backends.unavailable("gluon", device)``; whether TMA can address a call's operands is
``operands.gluon_operand_problem``; the split-K plan is ``configs.split_plan``.

Same contract as ``gemm_triton`` (twin: ``reference.int8_matmul_ref``)::

    acc[m, n] = sum_k q[m, k] * w[n, k]                     (int8 x int8 -> int32)
    out[m, n] = out_dtype((float32(acc) * s_tok[m]) * s_ch[n] + bias[n])   (or acc itself: RAW_INT32)

PAIR (``launch_gemm(..., up=(w3, s3))``): the SwiGLU gate/up pair from two weights, out [M, F] = silu(g) * u, each
B tile filled with rows of w1 on top and the same rows of w3 below. One warp-specialized persistent kernel runs two
schedules (``gluon-ws``, ``gluon-pingpong``) and split-K. The design, the pair's tile layout and the Hopper facts
it leans on: docs/design/gluon-gemm.md.
"""

from __future__ import annotations

import functools

import torch

from .configs import GLUON_CONSUMER_REGS, GLUON_LOADER_REGS, GemmConfig, gluon_epi_bufs, gluon_instr_n, split_plan
from .configs import gluon_rows_per_consumer as _rows
from .env import sm_count
from .gluon_api import IMPORT_ERROR
from .launch import launch

if IMPORT_ERROR is None:
    from .gemm_gluon_kernel import _w8a8_gluon_ws_kernel
    from .gluon_api import TensorDescriptor, gl

# The compiled kernel of the last launch (tests read its PTX).
LAST_LAUNCH: dict = {}


_GL_DTYPE = {}
if IMPORT_ERROR is None:
    _GL_DTYPE = {
        torch.bfloat16: gl.bfloat16,
        torch.float16: gl.float16,
        torch.float32: gl.float32,
        torch.int32: gl.int32,
    }


@functools.lru_cache(maxsize=256)
def _smem_layout(block: tuple, dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def build_launch(
    q, w, q_scale, w_scale, bias, out, cfg: GemmConfig, raw_int32=False, *, ws=None, num_sms=None, up=None
):
    """(kernel, grid, args, kwargs) of one launch. Device-free: the offline compile check calls it with
    CPU tensors. ``up = (w3, s3)``: the SwiGLU gate/up pair, ``w`` the gate weight w1 [F, K] (scale
    ``w_scale``), w3 [F, K] the up weight, out [M, F] (PAIR: each stage's B tile is loaded as two half boxes,
    one per weight). Split-K (split_plan(cfg, K)[1] > 1): the kernel writes int32 partials into ``ws``
    (contiguous int32 [S, M, N]) and ignores scales, bias and ``out``; the caller reduces. Misuse raises
    ValueError."""
    plan = _plan(q, w, q_scale, w_scale, bias, out, cfg, raw_int32, ws, num_sms, up)
    return _launch_args(plan, q, w, q_scale, w_scale, bias, out, ws, up)


def _plan(q, w, q_scale, w_scale, bias, out, cfg, raw_int32, ws, num_sms, up=None) -> tuple:
    """Everything of a launch but its tensors, validated: (kernel, grid, kwargs, descriptor blocks, kps)."""
    M, K = q.shape
    N = w.shape[0]
    pair = up is not None
    why = cfg.problem(out.element_size(), pair) if cfg.is_gluon else f"{cfg.key()} is not a Gluon config"
    if why is None and pair and (tuple(up[0].shape) != (N, K) or up[0].dtype != torch.int8):
        why = f"a gate/up pair is a SwiGLU epilogue over two int8 weights of one shape [F, K] = [{N}, {K}]"
    if why is None and pair and (raw_int32 or bias is not None):
        why = "the SwiGLU epilogue of the gate/up pair takes no raw_int32 and no bias"
    if why is not None:
        raise ValueError(f"{cfg.key()}: {why}")
    if q.dtype != torch.int8 or w.dtype != torch.int8 or w.shape[1] != K or out.shape != (M, N):
        raise ValueError("q [M, K] int8, w [N, K] int8, out [M, N]")
    if raw_int32 != (out.dtype == torch.int32) or out.dtype not in _GL_DTYPE:
        raise ValueError("raw_int32 needs an int32 out; otherwise out is bf16/fp16/fp32")
    kps, splits = split_plan(cfg, K)
    if splits > 1 and (
        ws is None or tuple(ws.shape) != (splits, M, N) or ws.dtype != torch.int32 or not ws.is_contiguous()
    ):
        raise ValueError(f"{cfg.key()}: split-K needs a contiguous int32 workspace ws [{splits}, {M}, {N}]")
    rows = _rows(cfg)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if splits > 1:
        # 3-D over ws [S, M, N], box [1, rows, epi_n]: TMA clips a tile's rows at M inside its slice
        c_block, c_ty, c_bytes, raw_int32 = [1, rows, cfg.epi_n], gl.int32, 4, True
    else:
        c_block, c_ty, c_bytes = [rows, cfg.epi_n], _GL_DTYPE[out.dtype], out.element_size()
    # PAIR: a weight box is half the B tile; the kernel allocates the full [BLOCK_N, BLOCK_K] tile (the same
    # NVMMA layout: the int8 rows are BLOCK_K bytes whatever their count) and the two boxes fill its halves
    b_rows = bn // 2 if pair else bn
    blocks = tuple(
        (b, _smem_layout(tuple(b), ty)) for b, ty in (([bm, bk], gl.int8), ([b_rows, bk], gl.int8), (c_block, c_ty))
    )
    units = -(-M // bm) * -(-N // b_rows) * splits
    grid = (max(1, min(num_sms or sm_count(q.device), units)),)
    # 4 + 4 + 1 warps round up to 3 warpgroups: the launch register cap must fit 12 warps
    # (65536 / (12 * 32) = 170 -> 168); setmaxnreg then moves the loader's share to the consumers.
    kwargs = dict(
        HAS_BIAS=bias is not None and splits == 1,
        RAW_INT32=raw_int32,
        PAIR=pair,
        GROUP_M=cfg.group_m,
        NUM_STAGES=cfg.num_stages,
        EPI_BUFS=gluon_epi_bufs(cfg, c_bytes, pair),
        INSTR_N=gluon_instr_n(bn),
        PINGPONG=cfg.kernel == "gluon-pingpong",
        SPLIT_K=splits,
        CONSUMER_REGS=GLUON_CONSUMER_REGS,
        LOADER_REGS=GLUON_LOADER_REGS,
        num_warps=4,
        maxnreg=168,
    )
    return _w8a8_gluon_ws_kernel, grid, kwargs, blocks, kps


def _launch_args(plan, q, w, q_scale, w_scale, bias, out, ws, up=None) -> tuple:
    """(kernel, grid, args, kwargs) of a plan for these tensors: the descriptors from the public constructor
    with the plan's cached layouts (the up weight's with the gate weight's block; without a pair the gate
    descriptor stands in for it, unread), pointers (or placeholders the kernel never reads)."""
    kernel, grid, kwargs, blocks, kps = plan
    c = ws if ws is not None else out
    a_desc, b_desc, c_desc = (
        TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), layout)
        for t, (block, layout) in zip((q, w, c), blocks, strict=True)
    )
    b2_desc, s3 = b_desc, None
    if up is not None:
        w3, s3 = up
        b2_desc = TensorDescriptor(w3, list(w3.shape), list(w3.stride()), list(blocks[1][0]), blocks[1][1])
    if ws is not None:  # the partials ignore scales and bias
        q_scale = w_scale = bias = None
    dummy = w_scale if w_scale is not None else c
    args = (
        a_desc,
        b_desc,
        b2_desc,
        c_desc,
        q_scale if q_scale is not None else dummy,
        dummy,
        s3 if s3 is not None else dummy,
        bias if bias is not None else dummy,
        q.shape[0],
        w.shape[0],
        q.shape[1],
        kps,
    )
    return kernel, grid, args, kwargs


_PLANS: dict = {}


def launch_gemm(q, w, cfg: GemmConfig, q_scale=None, w_scale=None, bias=None, out=None, raw_int32=False, *, up=None):
    """out = W8A8 GEMM of q [M, K] and w [N, K] (module docstring) with the Gluon config ``cfg``; returns
    ``out``. ``up = (w3, s3)``: the SwiGLU gate/up pair from two weights (``build_launch``). The caller has
    checked ``backends.unavailable("gluon", device)`` and ``operands.gluon_operand_problem``. A launch plan is
    kept per shape, strides and dtypes: a repeat call only builds the descriptors."""
    M, K = q.shape
    N = w.shape[0]
    kps, splits = split_plan(cfg, K)
    ws = torch.empty((splits, M, N), dtype=torch.int32, device=q.device) if splits > 1 else None
    key = (
        cfg,
        M,
        N,
        K,
        q.stride(0),
        w.stride(0),
        out.stride(0),
        out.dtype,
        raw_int32,
        q_scale is None,
        w_scale is None,
        bias is None,
        up is not None and up[0].stride(0),
        q.device,
    )
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(q, w, q_scale, w_scale, bias, out, cfg, raw_int32, ws, None, up)
        if len(_PLANS) > 512:
            _PLANS.clear()
        _PLANS[key] = plan
    LAST_LAUNCH["kernel"] = launch(*_launch_args(plan, q, w, q_scale, w_scale, bias, out, ws, up))
    if ws is not None:  # sum the S partial slices, then scales + bias (or the raw int32 sum)
        from .gemm_triton import reduce_partials

        reduce_partials(ws, q_scale, w_scale, bias, out, raw_int32)
    return out
