"""Per-head RMSNorm followed by split-half RoPE, in one Triton pass (Ideogram 4's q / k prologue).

Twin: ``reference.qk_norm_rope_ref``. Reads q (or k) straight out of the fused qkv projection
output (a strided view), normalizes each head row of D values in float32, rotates pairs
(i, i + D/2) by the token's angle, and writes a contiguous [B, N, H, D] tensor once. The eager
version is ~10 elementwise passes over a [B, N, H, D] float32 copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr,
    w_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    R,  # rows = B * N * H
    N,
    H,
    stride_xb,
    stride_xn,
    stride_xh,
    eps,
    HALF: tl.constexpr,
    ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    valid = rows < R
    h = rows % H
    n = (rows // H) % N
    b = rows // (H * N)
    cols = tl.arange(0, HALF)
    base = b.to(tl.int64) * stride_xb + n.to(tl.int64) * stride_xn + h.to(tl.int64) * stride_xh
    m = valid[:, None]
    x1 = tl.load(x_ptr + base[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base[:, None] + HALF + cols[None, :], mask=m, other=0.0).to(tl.float32)
    ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
    r = 1.0 / tl.sqrt(ms + eps)
    w1 = tl.load(w_ptr + cols).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + cols).to(tl.float32)
    y1 = x1 * r[:, None] * w1[None, :]
    y2 = x2 * r[:, None] * w2[None, :]
    c = tl.load(cos_ptr + n[:, None].to(tl.int64) * HALF + cols[None, :], mask=m, other=0.0)
    s = tl.load(sin_ptr + n[:, None].to(tl.int64) * HALF + cols[None, :], mask=m, other=0.0)
    o = rows[:, None].to(tl.int64) * (2 * HALF) + cols[None, :]
    out_ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + o, (y1 * c - y2 * s).to(out_ty), mask=m)
    tl.store(out_ptr + o + HALF, (y2 * c + y1 * s).to(out_ty), mask=m)


def build_launch(x, weight, cos, sin, eps, out=None) -> tuple:
    """(kernel, grid, args, kwargs) for x [B, N, H, D] -> out (a new contiguous one when None). Device-free."""
    B, N, H, D = x.shape
    out = torch.empty((B, N, H, D), dtype=x.dtype, device=x.device) if out is None else out
    rows = max(1, min(16, 4096 // D))
    args = (x, weight, cos, sin, out, B * N * H, N, H, x.stride(0), x.stride(1), x.stride(2), float(eps))
    return _qk_norm_rope_kernel, (triton.cdiv(B * N * H, rows),), args, dict(HALF=D // 2, ROWS=rows, num_warps=4)


def qk_norm_rope_triton(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float):
    """x [B, N, H, D] (last dim contiguous, any other strides) -> contiguous [B, N, H, D] in x's dtype."""
    B, N, H, D = x.shape
    out = torch.empty((B, N, H, D), dtype=x.dtype, device=x.device)
    if B * N * H == 0:
        return out
    launch(*build_launch(x, weight, cos, sin, eps, out))
    return out
