"""Fused W8A8 GEMM in Triton: int8 x int8 -> int32 on tensor cores, dequant + bias epilogue.

    out[m, n] = out_dtype((float(acc[m, n]) * s_tok[m]) * s_ch[n] + bias[n]),
    acc[m, n] = sum_k q[m, k] * w[n, k]            (q: [M, K] int8, w: [N, K] int8, K-contiguous)

Twin: ``reference.int8_matmul_ref`` / ``reference.int8_matmul_int32_ref``.

This module is the host side: it checks a config against the operands and builds (``build_launches``,
``gate_up_launch``, ``reduce_launch``) and runs (``launch_gemm``, ``reduce_partials``, ``apply_epilogue``) the
launches of the kernels in gemm_triton_kernels.py (whose docstring has the design notes).
"""

from __future__ import annotations

import torch
import triton

from .configs import pointer_k_split
from .env import sm_count
from .gemm_triton_kernels import (
    _gate_up_kernel,
    _gate_up_persistent_kernel,
    _split_k_epilogue_kernel,
    _w8a8_gemm_kernel,
    _w8a8_gemm_persistent_kernel,
)
from .launch import launch
from .operands import tma_problem

# The compiled kernel of the last launch (tests read its PTX to check wgmma vs mma.sync).
LAST_LAUNCH: dict = {}


def build_launches(
    q, w, cfg, q_scale=None, w_scale=None, bias=None, out=None, raw_int32=False, *, num_sms=None, up=None
) -> list[tuple]:
    """[(kernel, grid, args, kwargs)] of one portable GEMM (config kernel ``triton`` or ``triton-tma``), in
    launch order: the GEMM, then (split-K) the reduce. Device-free: the offline compile check builds the
    same launches from CPU tensors. A ``triton-tma`` config whose operands TMA cannot address gets the
    pointer kernel with its tile. ``up = (w3, s3)``: the SwiGLU gate/up pair from two weights (``w`` is the
    gate w1 [F, K], ``w_scale`` its scale; ``out`` [M, F]); see ``gate_up_launch``. Misuse raises ValueError."""
    if up is not None:
        return [gate_up_launch(q, w, w_scale, up[0], up[1], cfg, q_scale, bias, out, raw_int32, num_sms)]
    M, K = q.shape
    N = w.shape[0]
    why = cfg.problem(out.element_size()) if cfg.kernel in ("triton", "triton-tma") else "not portable"
    if why:
        raise ValueError(f"{cfg.key()}: {why}")
    if cfg.kernel == "triton-tma" and tma_problem(q, w, out) is None:
        return [_persistent_launch(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, num_sms)]
    k_per_split, even_k = pointer_k_split(cfg, K)
    split_k = triton.cdiv(K, k_per_split)
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), split_k)
    tiles = (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split_k == 1:
        epilogue = 0 if raw_int32 else 1
        args = (
            q,
            w,
            out,
            q_scale if q_scale is not None else out,
            w_scale if w_scale is not None else out,
            bias if bias is not None else out,
            M,
            N,
            K,
            q.stride(0),
            w.stride(0),
            out.stride(0),
            k_per_split,
            bias is not None,
            epilogue,
            even_k,
            *tiles,
        )
        return [(_w8a8_gemm_kernel, grid, args, opts)]
    # Split-K: each split stores an exact int32 partial into its workspace slice; one kernel sums them.
    ws = torch.empty((split_k, M, N), dtype=torch.int32, device=q.device)
    args = (q, w, ws, ws, ws, ws, M, N, K, q.stride(0), w.stride(0), N, k_per_split, False, 2, even_k, *tiles)
    return [(_w8a8_gemm_kernel, grid, args, opts), reduce_launch(ws, q_scale, w_scale, bias, out, raw_int32)]


def launch_gemm(q, w, cfg, q_scale=None, w_scale=None, bias=None, out=None, raw_int32=False, *, up=None):
    """Run the portable kernel with config ``cfg``; writes into and returns ``out``.

    raw_int32=True returns the int32 accumulator (``out`` must be int32); otherwise ``out`` gets
    the dequantized, biased result in its own dtype. ``up = (w3, s3)``: the SwiGLU gate/up pair, ``w`` the
    gate weight w1 [F, K] (scale ``w_scale``), w3 [F, K] the up weight, ``out`` [M, F] gets silu(gate) * up.
    """
    for i, (kernel, grid, args, kwargs) in enumerate(
        build_launches(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, up=up)
    ):
        compiled = launch(kernel, grid, args, kwargs)
        if i == 0:  # the GEMM (tests read its PTX), not the split-K reduce
            LAST_LAUNCH["kernel"] = compiled
    return out


def apply_epilogue(acc, q_scale, w_scale, bias=None, out_dtype=torch.bfloat16, out=None):
    """out = out_dtype((acc * q_scale[m]) * w_scale[n] + bias[n]) for an int32 accumulator [M, N]."""
    M, N = acc.shape
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=acc.device)
    return reduce_partials(acc.contiguous().reshape(1, M, N), q_scale, w_scale, bias, out, raw_int32=False)


def reduce_launch(ws, q_scale, w_scale, bias, out, raw_int32) -> tuple:
    """(kernel, grid, args, kwargs): out = the sum of the int32 slices of ws [S, M, N], raw or scaled + biased."""
    splits, M, N = ws.shape
    bm, bn = 32, 128
    args = (
        ws,
        out,
        q_scale if q_scale is not None else out,
        w_scale if w_scale is not None else out,
        bias if bias is not None else out,
        M,
        N,
        out.stride(0),
        splits,
        bias is not None,
        raw_int32,
        bm,
        bn,
    )
    return _split_k_epilogue_kernel, (triton.cdiv(M, bm), triton.cdiv(N, bn)), args, dict(num_warps=4)


def reduce_partials(ws, q_scale, w_scale, bias, out, raw_int32):
    launch(*reduce_launch(ws, q_scale, w_scale, bias, out, raw_int32))
    return out


def _num_sms(device) -> int:
    if device.type != "cuda":
        return 4  # the CPU interpreter: a few programs exercise the persistent loop
    return sm_count(device)


def _persistent_launch(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, num_sms=None) -> tuple:
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = q.shape
    N = w.shape[0]
    subtile = bool(cfg.subtile)
    c_block_n = cfg.block_n // 2 if subtile else cfg.block_n
    a_desc = TensorDescriptor.from_tensor(q, [cfg.block_m, cfg.block_k])
    b_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    c_desc = TensorDescriptor.from_tensor(out, [cfg.block_m, c_block_n])
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    programs = min(num_sms or _num_sms(q.device), tiles)
    args = (
        a_desc,
        b_desc,
        c_desc,
        q_scale if q_scale is not None else out,
        w_scale if w_scale is not None else out,
        bias if bias is not None else out,
        M,
        N,
        K,
        bias is not None,
        raw_int32,
        cfg.block_m,
        cfg.block_n,
        cfg.block_k,
        cfg.group_m,
        programs,
        subtile,
    )
    return _w8a8_gemm_persistent_kernel, (programs,), args, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def gate_up_launch(q, w1, s1, w3, s3, cfg, q_scale, bias=None, out=None, raw_int32=False, num_sms=None) -> tuple:
    """(kernel, grid, args, kwargs) of the SwiGLU gate/up pair read from two weights w1, w3 [F, K] (per-channel
    scales s1, s3 [F]): out [M, F] = silu(g) * u. A tile of width BLOCK_N reads BLOCK_N // 2 rows of each weight
    (the shared memory and MMA shape of a linear tile of that width); F needs no alignment. ``triton-tma`` runs
    the persistent TMA kernel where TMA can address every operand, else the pointer kernel with its tile. Misuse
    raises ValueError."""
    M, K = q.shape
    F = w1.shape[0]
    why = cfg.problem(out.element_size(), swiglu=True) if cfg.kernel in ("triton", "triton-tma") else "not portable"
    if why is None and (raw_int32 or bias is not None):
        why = "the gate/up pair is a SwiGLU epilogue: no raw int32, no bias"
    if why is None and (
        tuple(w3.shape) != (F, K) or tuple(out.shape) != (M, F) or q_scale is None or s1 is None or s3 is None
    ):
        why = f"w1 / w3 must both be [F, K] = [{F}, {K}], out [M, F] = [{M}, {F}], with all three scales"
    if why:
        raise ValueError(f"{cfg.key()}: {why}")
    tiles = (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    n_tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(F, cfg.block_n // 2)
    if cfg.kernel == "triton-tma" and tma_problem(q, w1, w3, out) is None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        half = cfg.block_n // 2
        descs = (
            TensorDescriptor.from_tensor(q, [cfg.block_m, cfg.block_k]),
            TensorDescriptor.from_tensor(w1, [half, cfg.block_k]),
            TensorDescriptor.from_tensor(w3, [half, cfg.block_k]),
            TensorDescriptor.from_tensor(out, [cfg.block_m, half]),
        )
        programs = min(num_sms or _num_sms(q.device), n_tiles)
        args = (*descs, q_scale, s1, s3, M, F, K, *tiles, programs)
        return _gate_up_persistent_kernel, (programs,), args, opts
    args = (
        q,
        w1,
        w3,
        out,
        q_scale,
        s1,
        s3,
        M,
        F,
        K,
        q.stride(0),
        w1.stride(0),
        w3.stride(0),
        out.stride(0),
        K % cfg.block_k == 0,
        *tiles,
    )
    return _gate_up_kernel, (n_tiles,), args, opts
