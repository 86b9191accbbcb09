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
row feeds (``handoff.py``), with the activation quantizer's own arithmetic (``quant_triton.quantize_split_row``) on the
same values the quantizer would read back: the int8 row and its scale are bit for bit what ``quantize_per_token``
gives for the stored output, without its second read of the row and its launch.

A row is held as a power-of-two head tile and, where the width is a power of two more (Ideogram 4's 4608 = 4096 +
512), a tail tile, with its sums as scalars, as the activation quantizer holds it: one 8192-wide tile would leave
almost half of the lanes masked, and ran well below the memory bandwidth (docs/design/measurements.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .quant_triton import pow2_split, quantize_split_row


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
def _load_f32(ptr, cols, C):
    return tl.load(ptr + cols, mask=cols < C, other=0.0).to(tl.float32)


@triton.jit
def _modulated(x, r, w_ptr, v_row, h_row, cols, C, out_ty, RESIDUAL: tl.constexpr, BF16: tl.constexpr):
    """One tile of the output row, rounded where the unfused ops round (float32 values of ``out_ty``)."""
    n = _rounded(x * r * _load_f32(w_ptr, cols, C), out_ty, BF16)  # what F.rms_norm returns
    y = _rounded(n * _load_f32(v_row, cols, C), out_ty, BF16)
    if RESIDUAL:
        y = _rounded(_load_f32(h_row, cols, C) + y, out_ty, BF16)
    return y


@triton.jit
def _rms_modulate_kernel(
    src_ptr,  # the rows to normalize: [R, C], unit column stride, row stride stride_s
    res_ptr,  # RESIDUAL: the residual rows [R, C] (row stride stride_r)
    w_ptr,  # the norm's weight [C]
    v_ptr,  # the modulation vector of each batch item: [B, C], row stride stride_v (0: one for all)
    out_ptr,  # [R, C] contiguous
    q_ptr,  # QUANT: the int8 rows [R, C] contiguous
    qscale_ptr,  # QUANT: their float32 scales [R]
    N,  # rows per batch item (tokens)
    C,
    stride_s,
    stride_r,
    stride_v,
    eps,
    RESIDUAL: tl.constexpr,
    QUANT: tl.constexpr,
    BF16: tl.constexpr,
    HEAD: tl.constexpr,  # a power of two: columns [0, HEAD), masked past C
    TAIL: tl.constexpr,  # 0, or a power of two: columns [HEAD, HEAD + TAIL) = the rest of the row exactly
):
    row = tl.program_id(0)
    r64 = row.to(tl.int64)
    src_row = src_ptr + r64 * stride_s
    v_row = v_ptr + (row // N).to(tl.int64) * stride_v
    h_row = res_ptr + r64 * stride_r
    out_ty = out_ptr.dtype.element_ty
    ch = tl.arange(0, HEAD)
    xh = _load_f32(src_row, ch, C)
    ss = tl.sum(xh * xh, axis=0)
    if TAIL > 0:
        ct = HEAD + tl.arange(0, TAIL)
        xt = _load_f32(src_row, ct, C)
        ss += tl.sum(xt * xt, axis=0)
    r = 1.0 / tl.sqrt(ss / C + eps)
    yh = _modulated(xh, r, w_ptr, v_row, h_row, ch, C, out_ty, RESIDUAL, BF16)
    tl.store(out_ptr + r64 * C + ch, yh.to(out_ty), mask=ch < C)
    if TAIL > 0:
        yt = _modulated(xt, r, w_ptr, v_row, h_row, ct, C, out_ty, RESIDUAL, BF16)
        tl.store(out_ptr + r64 * C + ct, yt.to(out_ty), mask=ct < C)
    if QUANT:  # y holds the stored values exactly (rounded above): what the quantizer would read back
        if TAIL > 0:
            qh, qt, scale = quantize_split_row(yh, yt, True)
            tl.store(q_ptr + r64 * C + ct, qt, mask=ct < C)
        else:
            qh, _, scale = quantize_split_row(yh, yh, False)
        tl.store(q_ptr + r64 * C + ch, qh, mask=ch < C)
        tl.store(qscale_ptr + row, scale)


def row_tiles(C: int) -> tuple[int, int]:
    """(HEAD, TAIL) of a row of C columns: C = a power of two + a power of two where it is (4608 = 4096 + 512),
    else one masked power-of-two tile."""
    split = pow2_split(C)
    if split is not None and (split[1] == 0 or split[1] >= 16):
        return split
    return triton.next_power_of_2(C), 0


def build_launch(src, residual, weight, vector, rows_per_item: int, eps: float, out, quantized=None, num_warps=None):
    """(kernel, grid, args, kwargs) for src [R, C] (rows of ``rows_per_item`` tokens per batch item), vector
    [B or 1, C] -> out [R, C], and (``quantized`` = (q int8 [R, C], scale float32 [R])) out's per-token int8 form.
    ``num_warps``: the launch's (default: 4, 8 from 8192 columns; bench/probes/block_norms.py sweeps it). Device-free."""
    R, C = src.shape
    head, tail = row_tiles(C)
    res = residual if residual is not None else src
    q, qscale = quantized if quantized is not None else (out, out)  # unread without QUANT
    stride_v = vector.stride(0) if vector.shape[0] > 1 else 0
    strides = (src.stride(0), res.stride(0), stride_v)
    args = (src, res, weight, vector, out, q, qscale, rows_per_item, C, *strides, float(eps))
    kwargs = dict(
        RESIDUAL=residual is not None,
        QUANT=quantized is not None,
        BF16=src.dtype == torch.bfloat16,
        HEAD=head,
        TAIL=tail,
        num_warps=num_warps or (4 if head <= 4096 else 8),
    )
    return _rms_modulate_kernel, (R,), args, kwargs


def rms_modulate_triton(
    src, residual, weight, vector, rows_per_item: int, eps: float, quantize: bool = False, num_warps=None
):
    """Validated 2-D operands (dispatch.rms_norm_modulate / rms_norm_gated_residual) -> a new [R, C] tensor, or
    (``quantize``) (out, q int8 [R, C], scale float32 [R]). ``num_warps``: build_launch's."""
    out = torch.empty(src.shape, dtype=src.dtype, device=src.device)
    quantized = None
    if quantize:
        quantized = (
            torch.empty(src.shape, dtype=torch.int8, device=src.device),
            torch.empty(src.shape[0], dtype=torch.float32, device=src.device),
        )
    if src.shape[0]:
        launch(*build_launch(src, residual, weight, vector, rows_per_item, eps, out, quantized, num_warps))
    return out if quantized is None else (out, *quantized)
