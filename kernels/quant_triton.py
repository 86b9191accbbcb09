"""Per-token activation quantization in one Triton kernel.

Twin: ``reference.quantize_per_token_ref`` (same roundings, bit-identical output).

One program handles BLOCK_M rows. When the whole row fits in one tile (K <= BLOCK_K) the row
is read once; otherwise a first loop finds the row's absmax and a second loop quantizes
(the second read of a 9-100 KB row mostly hits L2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .env import interpreter_mode

if interpreter_mode():
    # Triton's CPU interpreter has no libdevice.rint. Adding and subtracting 1.5 * 2**23 rounds
    # an fp32 |v| < 2**22 to the nearest integer, ties to even, with plain IEEE adds (numpy
    # does not contract or reassociate). The GPU build uses cvt.rni below; both round the
    # same already-rounded product, so CPU tests check the same function the GPU runs.
    @triton.jit
    def _round_half_even(v):
        return (v + 12582912.0) - 12582912.0

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _round_half_even(v):
        return libdevice.rint(v)


@triton.jit
def _load_row_tile(x_ptr, smooth_ptr, rows, cols, M, K, stride_xm, HAS_SMOOTH: tl.constexpr):
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    if HAS_SMOOTH:
        s = tl.load(smooth_ptr + cols, mask=cols < K, other=1.0).to(tl.float32)
        x = tl.math.div_rn(x, s[None, :])
    return x, mask


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    smooth_ptr,
    q_ptr,
    scale_ptr,
    M,
    K,
    stride_xm,
    stride_qm,
    HAS_SMOOTH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols0 = tl.arange(0, BLOCK_K)
    INF: tl.constexpr = float("inf")

    # Pass 1: absmax over finite values, and whether the row holds NaN/Inf.
    # (x < inf) is False for both NaN and +-Inf on |x|.
    if ONE_PASS:
        x, mask = _load_row_tile(x_ptr, smooth_ptr, rows, cols0, M, K, stride_xm, HAS_SMOOTH)
        ax = tl.abs(x)
        finite = ax < INF
        amax = tl.max(tl.where(finite, ax, 0.0), axis=1)
        bad = tl.max(tl.where(finite, 0, 1), axis=1)
    else:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        bad = tl.zeros((BLOCK_M,), dtype=tl.int32)
        for k0 in range(0, K, BLOCK_K):
            x, mask = _load_row_tile(x_ptr, smooth_ptr, rows, k0 + cols0, M, K, stride_xm, HAS_SMOOTH)
            ax = tl.abs(x)
            finite = ax < INF
            amax = tl.maximum(amax, tl.max(tl.where(finite, ax, 0.0), axis=1))
            bad = tl.maximum(bad, tl.max(tl.where(finite, 0, 1), axis=1))

    ok = (bad == 0) & (amax > 0.0)
    # One IEEE division per row, then multiplies: the twin does exactly the same.
    inv = tl.where(ok, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), tl.where(ok, amax, 1.0)), 0.0)
    scale = tl.where(bad == 0, tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)), float("nan"))
    tl.store(scale_ptr + rows, scale, mask=rows < M)

    # Pass 2: quantize. Non-finite rows write zeros (their scale is NaN, so the output row is NaN).
    if ONE_PASS:
        v = _round_half_even(x * inv[:, None])
        v = tl.minimum(tl.maximum(v, -127.0), 127.0)
        v = tl.where(ok[:, None], v, 0.0)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_qm + cols0[None, :], v.to(tl.int8), mask=mask)
    else:
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + cols0
            x, mask = _load_row_tile(x_ptr, smooth_ptr, rows, cols, M, K, stride_xm, HAS_SMOOTH)
            v = _round_half_even(x * inv[:, None])
            v = tl.minimum(tl.maximum(v, -127.0), 127.0)
            v = tl.where(ok[:, None], v, 0.0)
            tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_qm + cols[None, :], v.to(tl.int8), mask=mask)


# Tile heuristics: whole rows up to 16 K elements; beyond, 8 K-wide chunks in two passes.
_ONE_PASS_MAX_K = 16384
_CHUNK_K = 8192


def quant_launch_params(M: int, K: int) -> dict:
    block_k = triton.next_power_of_2(K)
    if block_k <= _ONE_PASS_MAX_K:
        one_pass = True
    else:
        block_k, one_pass = _CHUNK_K, False
    # Keep ~8-16 K elements per program: small K rows are packed several to a program.
    block_m = max(1, min(16, 8192 // block_k))
    num_warps = 8 if block_m * block_k >= 8192 else 4
    return dict(BLOCK_M=block_m, BLOCK_K=block_k, ONE_PASS=one_pass, num_warps=num_warps)


def quantize_rows_triton(x: torch.Tensor, smooth: torch.Tensor | None = None, params: dict | None = None):
    """x [M, K] (row stride arbitrary, unit column stride) -> (int8 [M, K], float32 [M]).

    ``params`` overrides the launch heuristic (benchmark sweeps)."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=torch.int8, device=x.device)
    scale = torch.empty((M,), dtype=torch.float32, device=x.device)
    if M == 0:
        return q, scale
    p = params or quant_launch_params(M, K)
    grid = (triton.cdiv(M, p["BLOCK_M"]),)
    _quantize_rows_kernel[grid](
        x,
        smooth if smooth is not None else x,
        q,
        scale,
        M,
        K,
        x.stride(0),
        q.stride(0),
        HAS_SMOOTH=smooth is not None,
        BLOCK_M=p["BLOCK_M"],
        BLOCK_K=p["BLOCK_K"],
        ONE_PASS=p["ONE_PASS"],
        num_warps=p["num_warps"],
    )
    return q, scale
