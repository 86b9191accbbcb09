"""RMSNorm with the DiT block's modulation around it, in one Triton pass per row.

Twins: ``reference.rms_norm_modulate_ref`` and ``reference.rms_norm_gated_residual_ref``. An Ideogram 4 block
runs four RMSNorms per pass, each with a broadcast multiply after it (by ``1 + scale`` before the attention and
the FFN, by ``tanh(gate)`` after them) and, after the two outer ones, the residual add: eager, that is three
kernels and three round trips of a [tokens, 4608] bf16 tensor per site. Here each row is read once.

The roundings are those of the unfused ops, at the same points: the normalized row is rounded to the input's
dtype (as ``F.rms_norm`` returns it), then the product with the modulation vector, then (``RESIDUAL``) the sum
with the residual row. Only the float32 mean of squares may differ from torch's in its last bit (another summation
order), which moves a rounded value by one unit in the last place now and then.

``QUANT`` (the pre-norms only): the program also quantizes the row it has just rounded, per token, for the linear the
row feeds (``handoff.py``), with the activation quantizer's own arithmetic (``quant_triton.quantize_row``) on the same
values the quantizer would read back: the int8 row and its scale are bit for bit what ``quantize_per_token`` gives
for the stored output, without its second read of the row and its launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .quant_triton import quantize_tile_rows


@triton.jit
def _rounded(v, out_ty, BF16: tl.constexpr):
    """``v`` (float32) rounded to ``out_ty`` half-to-even, as float32. bfloat16 by hand: Triton's interpreter (the CPU
    tests) truncates that cast, the GPU rounds it; the bits below agree with both. NaN stays NaN."""
    if BF16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    return v.to(out_ty).to(tl.float32)


@triton.jit
def _rms_modulate_kernel(
    src_ptr,  # the rows to normalize: [R, C], unit column stride, row stride stride_s
    res_ptr,  # RESIDUAL: the residual rows [R, C] (row stride stride_r)
    w_ptr,  # the norm's weight [C]
    v_ptr,  # the modulation vector of each batch item: [B, C], row stride stride_v (0: one for all)
    out_ptr,  # [R, C] contiguous
    q_ptr,  # QUANT: the int8 rows [R, C] contiguous
    qscale_ptr,  # QUANT: their float32 scales [R]
    R,
    N,  # rows per batch item (tokens)
    C,
    stride_s,
    stride_r,
    stride_v,
    eps,
    RESIDUAL: tl.constexpr,
    QUANT: tl.constexpr,
    BF16: tl.constexpr,
    ROWS: tl.constexpr,  # rows per program: the weight is loaded once for them, the vector's reloads hit L1
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cmask = cols < C
    mask = (rows < R)[:, None] & cmask[None, :]
    r64 = rows.to(tl.int64)[:, None]
    out_ty = out_ptr.dtype.element_ty
    x = tl.load(src_ptr + r64 * stride_s + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / C + eps)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    n = _rounded(x * r[:, None] * w[None, :], out_ty, BF16)  # what F.rms_norm returns
    item = (rows // N).to(tl.int64)[:, None]
    v = tl.load(v_ptr + item * stride_v + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = _rounded(n * v, out_ty, BF16)
    if RESIDUAL:
        h = tl.load(res_ptr + r64 * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = _rounded(h + y, out_ty, BF16)
    tl.store(out_ptr + r64 * C + cols[None, :], y.to(out_ty), mask=mask)
    if QUANT:  # y holds the stored values exactly (rounded above): what the quantizer would read back
        q, scale = quantize_tile_rows(y)
        tl.store(q_ptr + r64 * C + cols[None, :], q, mask=mask)
        tl.store(qscale_ptr + rows, scale, mask=rows < R)


# Launch shape: rows per program and warps (bench/block_norms.py measures the choices on a GPU)
ROWS = 1


def _warps(block: int, rows: int) -> int:
    return max(4, min(16, block * rows // 512))


def build_launch(
    src, residual, weight, vector, rows_per_item: int, eps: float, out, quantized=None, rows=None, num_warps=None
) -> tuple:
    """(kernel, grid, args, kwargs) for src [R, C] (rows of ``rows_per_item`` tokens per batch item), vector
    [B or 1, C] -> out [R, C], and (``quantized`` = (q int8 [R, C], scale float32 [R])) out's per-token int8 form.
    ``rows`` / ``num_warps``: the launch shape (default ``ROWS``, ``_warps``). Device-free."""
    R, C = src.shape
    block = triton.next_power_of_2(C)
    rows = rows or ROWS
    res = residual if residual is not None else src
    q, qscale = quantized if quantized is not None else (out, out)  # unread without QUANT
    stride_v = vector.stride(0) if vector.shape[0] > 1 else 0
    strides = (src.stride(0), res.stride(0), stride_v)
    args = (src, res, weight, vector, out, q, qscale, R, rows_per_item, C, *strides, float(eps))
    kwargs = dict(
        RESIDUAL=residual is not None,
        QUANT=quantized is not None,
        BF16=src.dtype == torch.bfloat16,
        ROWS=rows,
        BLOCK=block,
        num_warps=num_warps or _warps(block, rows),
    )
    return _rms_modulate_kernel, (triton.cdiv(R, rows),), args, kwargs


def rms_modulate_triton(
    src, residual, weight, vector, rows_per_item: int, eps: float, quantize: bool = False, rows=None, num_warps=None
):
    """Validated 2-D operands (dispatch.rms_norm_modulate / rms_norm_gated_residual) -> a new [R, C] tensor, or
    (``quantize``) (out, q int8 [R, C], scale float32 [R]). ``rows`` / ``num_warps``: build_launch's."""
    out = torch.empty(src.shape, dtype=src.dtype, device=src.device)
    quantized = None
    if quantize:
        quantized = (
            torch.empty(src.shape, dtype=torch.int8, device=src.device),
            torch.empty(src.shape[0], dtype=torch.float32, device=src.device),
        )
    if src.shape[0]:
        launch(*build_launch(src, residual, weight, vector, rows_per_item, eps, out, quantized, rows, num_warps))
    return out if quantized is None else (out, *quantized)
