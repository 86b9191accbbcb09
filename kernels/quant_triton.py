"""Per-token activation quantization in one Triton kernel.

Twin: ``reference.quantize_per_token_ref`` (same roundings, bit-identical output).

Codes: int8 (scale = absmax / 127), or float8 e4m3 (absmax / 448; Ada and Hopper, for an FP8 GEMM) when the output
tensor is float8_e4m3fn: the same passes, only the scale's constant and the rounding differ.

One program handles BLOCK_M rows. When the whole row fits in one tile (K <= BLOCK_K) the row
is read once; otherwise a first loop finds the row's absmax and a second loop quantizes
(the second read of a 9-100 KB row mostly hits L2).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .env import interpreter_mode, sm_count
from .launch import launch


@triton.jit
def _max_nan(a, b):
    # a NaN wins the max (max.NaN.f32): one compare per element finds absmax and non-finite rows
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


if interpreter_mode():
    # Triton's CPU interpreter has no libdevice. Adding and subtracting 1.5 * 2**23 rounds an
    # fp32 |v| < 2**22 to the nearest integer, ties to even, with plain IEEE adds (numpy does not
    # contract or reassociate). The GPU build converts with cvt.rni below; both round the same
    # already-rounded product half to even, so CPU tests check the function the GPU runs (the
    # select here only keeps numpy's NaN-to-int cast out of rejected rows).
    @triton.jit
    def _round_to_int8(v, ok):
        return tl.where(ok, ((v + 12582912.0) - 12582912.0).to(tl.int32), 0).to(tl.int8)

    # The interpreter's float32 -> e4m3 cast misrounds values that round up into the next binade (126.7
    # gave 64), but converts every e4m3 value exactly: round on e4m3's grid first, in float32. The step
    # is 2^(exponent - 3), at least 2^-9 (the subnormal spacing); dividing and multiplying by a power
    # of two is exact, and the integer quotient rounds half to even as above. Inputs lie within
    # +-448 (1 + 2^-24)^2, which rounds to +-448; the clamp only says so.
    @triton.jit
    def _round_to_fp8(v, ok):
        a = tl.abs(v)
        exponent = a.to(tl.int32, bitcast=True) >> 23
        step = ((tl.maximum(exponent, 121) - 3) << 23).to(tl.float32, bitcast=True)
        r = tl.minimum(((a / step + 12582912.0) - 12582912.0) * step, 448.0)
        # the sign goes on as a bit: a value that rounds to zero keeps its -0 code, as the GPU's cvt keeps it
        # (Triton 3.4's interpreter casts -0.0 to +0)
        sign = tl.where(ok, tl.where(v.to(tl.int32, bitcast=True) < 0, 128, 0), 0).to(tl.uint8)
        code = tl.where(ok, r, 0.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        return (code | sign).to(tl.float8e4nv, bitcast=True)

    # The interpreter runs a custom-combine tl.reduce element by element in Python; the built-in
    # max over |x| with NaN mapped to inf gives the same amax test.
    @triton.jit
    def _absmax(x, AXIS: tl.constexpr):
        ax = tl.abs(x)
        return tl.max(tl.where(ax < float("inf"), ax, float("inf")), axis=AXIS)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _round_to_int8(v, ok):
        # One cvt.rni.s32.f32 (round half to even and convert), then the low byte. Rows that are not
        # ok have inv = 0, so v is +-0 or NaN (from +-inf / NaN inputs); cvt turns NaN into 0 or
        # 0x80000000, whose low byte is 0 as well: no per-element select needed.
        return libdevice.float2int_rn(v).to(tl.int8)

    @triton.jit
    def _round_to_fp8(v, ok):
        # cvt.rn.satfinite to e4m3: round half to even; rows that are not ok may hold NaN, so they are zeroed first
        return tl.where(ok, v, 0.0).to(tl.float8e4nv)

    @triton.jit
    def _absmax(x, AXIS: tl.constexpr):
        return tl.reduce(tl.abs(x), AXIS, _max_nan)


@triton.jit
def _row_absmax(x):
    return _absmax(x, 1)


@triton.jit
def _quantize_tile(x, inv, ok, FP8: tl.constexpr = False):
    """int8 (FP8: float8 e4m3) of x * inv (inv, ok: [BLOCK_M, 1], or one row's scalars), half to even;
    rows that are not ok (zero, non-finite, inv overflow) give 0. No clamp: |x| <= amax and
    inv = RN(QMAX / amax) give |RN(x * inv)| <= QMAX (1 + 2^-24)^2, which rounds to at most 127
    (int8) or 448 (e4m3's largest finite value)."""
    if FP8:
        q = _round_to_fp8(x * inv, ok)
    else:
        q = _round_to_int8(x * inv, ok)
    return q


@triton.jit
def _row_scale(amax, QMAX: tl.constexpr = 127.0):
    """(inv, ok, scale) of rows (or one row, as scalars) whose absmax is ``amax`` (NaN or inf: the row holds
    NaN/Inf), for codes up to QMAX (127 for int8, 448 for e4m3). One IEEE division per row, then multiplies: the
    twin does exactly the same. A row whose QMAX / amax overflows (amax < 3.7e-37 for int8, 1.3e-36 for e4m3)
    quantizes to zeros like an all-zero row; a non-finite row gets zeros and scale NaN (its output row is NaN)."""
    not_finite = ~(amax < float("inf"))
    inv = tl.math.div_rn(tl.full(amax.shape, QMAX, tl.float32), tl.where(amax > 0.0, amax, 1.0))
    ok = ~not_finite & (amax > 0.0) & (inv < float("inf"))
    inv = tl.where(ok, inv, 0.0)
    scale = tl.where(not_finite, float("nan"), tl.math.div_rn(amax, tl.full(amax.shape, QMAX, tl.float32)))
    return inv, ok, scale


@triton.jit
def quantize_split_row(head, tail, HAS_TAIL: tl.constexpr):
    """(int8 head, int8 tail, float32 scale) of one row held by a producer kernel as a head and (``HAS_TAIL``) a tail
    tile (float32, masked columns 0; rms_modulate_triton.py): the arithmetic of the kernel below with its row as
    scalars, so the result is bit for bit what ``quantize_rows_triton`` gives for the same values."""
    amax = _absmax(head, None)
    if HAS_TAIL:
        amax = _max_nan(amax, _absmax(tail, None))
    inv, ok, scale = _row_scale(amax)
    return _quantize_tile(head, inv, ok), _quantize_tile(tail, inv, ok), scale


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
    NUM_STAGES: tl.constexpr,
    TAIL_K: tl.constexpr,
):
    FP8: tl.constexpr = q_ptr.dtype.element_ty == tl.float8e4nv  # e4m3 codes instead of int8
    # Persistent when launched with fewer programs than row blocks: each program strides over
    # row blocks (no partial last wave; the next block's loads can be pipelined).
    for blk in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=NUM_STAGES):
        _quantize_block(
            x_ptr,
            smooth_ptr,
            q_ptr,
            scale_ptr,
            blk,
            M,
            K,
            stride_xm,
            stride_qm,
            HAS_SMOOTH,
            BLOCK_M,
            BLOCK_K,
            ONE_PASS,
            TAIL_K,
            FP8,
        )


@triton.jit
def _quantize_block(
    x_ptr,
    smooth_ptr,
    q_ptr,
    scale_ptr,
    blk,
    M,
    K,
    stride_xm,
    stride_qm,
    HAS_SMOOTH: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ONE_PASS: tl.constexpr,
    TAIL_K: tl.constexpr,
    FP8: tl.constexpr,
):
    """ONE_PASS: the row is held in registers as a BLOCK_K tile, plus (TAIL_K > 0) a second
    TAIL_K tile at column BLOCK_K, so a K like 4608 = 4096 + 512 needs no half-masked 8192 tile.
    FP8: float8 e4m3 codes (scale = absmax / 448) instead of int8 (absmax / 127)."""
    QMAX: tl.constexpr = 448.0 if FP8 else 127.0
    # One row in a head and a tail tile: its absmax, inv and ok are kept as scalars (see below).
    ROW_SCALARS: tl.constexpr = ONE_PASS and TAIL_K > 0 and BLOCK_M == 1
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    cols0 = tl.arange(0, BLOCK_K)

    # Pass 1: one NaN-propagating max-reduction per row gives the absmax and whether the row holds
    # NaN/Inf (its max is then NaN or inf): one compare per element, one cross-warp reduction.
    if ONE_PASS:
        x, mask = _load_row_tile(x_ptr, smooth_ptr, rows, cols0, M, K, stride_xm, HAS_SMOOTH)
        if TAIL_K > 0:
            cols_t = BLOCK_K + tl.arange(0, TAIL_K)
            xt, mask_t = _load_row_tile(x_ptr, smooth_ptr, rows, cols_t, M, K, stride_xm, HAS_SMOOTH)
            if ROW_SCALARS:
                # The two tiles have different register layouts. Combined as [1]-vectors, Triton
                # moved the whole 4096-wide tile through shared memory into the tail's layout
                # (4 rounds, 8 barriers per row); combined as scalars, nothing moves.
                amax = _max_nan(_absmax(x, None), _absmax(xt, None))
            else:
                amax = _max_nan(_row_absmax(x), _row_absmax(xt))
        else:
            amax = _row_absmax(x)
    else:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x, mask = _load_row_tile(x_ptr, smooth_ptr, rows, k0 + cols0, M, K, stride_xm, HAS_SMOOTH)
            amax = _max_nan(amax, _row_absmax(x))
    inv, ok, scale = _row_scale(amax, QMAX)
    tl.store(scale_ptr + rows, scale, mask=rows < M)

    if not ROW_SCALARS:
        inv = inv[:, None]
        ok = ok[:, None]

    # Pass 2: quantize. Non-finite rows write zeros (their scale is NaN, so the output row is NaN).
    q_row = q_ptr + rows[:, None].to(tl.int64) * stride_qm
    if ONE_PASS:
        tl.store(q_row + cols0[None, :], _quantize_tile(x, inv, ok, FP8), mask=mask)
        if TAIL_K > 0:
            tl.store(q_row + cols_t[None, :], _quantize_tile(xt, inv, ok, FP8), mask=mask_t)
    else:
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + cols0
            x, mask = _load_row_tile(x_ptr, smooth_ptr, rows, cols, M, K, stride_xm, HAS_SMOOTH)
            tl.store(q_row + cols[None, :], _quantize_tile(x, inv, ok, FP8), mask=mask)


# -- ConvRot: the rotation inside the quantizer ------------------------------------------------------
# int8_convrot files store W rotated along K by H_G in groups of G (reference.hadamard); the activation
# must be rotated the same way before it is quantized. H_256 = H_16 (x) H_16 (a Kronecker product), so a
# 256-wide group viewed as a 16 x 16 matrix X rotates as H_16 X H_16: two products with K = 16 per group,
# in float32 (input_precision="ieee": exact products, float32 sums) instead of a [G, G] matrix per group.
ROTATION_GROUPS = (16, 256)


@triton.jit
def _rotate_groups(t, h, BLOCK_M: tl.constexpr, G: tl.constexpr):
    """t [BLOCK_M, G] float32 -> every row times H_G (h: H_16, float32 [16, 16], symmetric)."""
    if G == 16:
        r = tl.dot(t, h, input_precision="ieee")
    else:  # (an explicit else: the compiler builds the statements after a constexpr-if's return too)
        z = tl.dot(tl.reshape(t, (BLOCK_M * 16, 16)), h, input_precision="ieee")  # X H: [b * 16 + i, c]
        z = tl.reshape(tl.permute(tl.reshape(z, (BLOCK_M, 16, 16)), (0, 2, 1)), (BLOCK_M * 16, 16))
        z = tl.dot(z, h, input_precision="ieee")  # (X H)^T H = (H X H)^T: [b * 16 + c, a]
        r = tl.reshape(tl.permute(tl.reshape(z, (BLOCK_M, 16, 16)), (0, 2, 1)), (BLOCK_M, G))
    return r


@triton.jit
def _load_rotated(x_ptr, h, rows, k0, M, stride_xm, BLOCK_M: tl.constexpr, G: tl.constexpr):
    cols = k0 + tl.arange(0, G)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=rows[:, None] < M, other=0.0)
    return _rotate_groups(x.to(tl.float32), h, BLOCK_M, G), cols


@triton.jit
def _quantize_rotated_kernel(
    x_ptr, h_ptr, q_ptr, scale_ptr, M, K, stride_xm, stride_qm, BLOCK_M: tl.constexpr, G: tl.constexpr
):
    """Per-token quantization of x [M, K] rotated by H_G group by group (K % G == 0): the rotated row's
    absmax in a first pass, the rotation again and the int8 values in a second (the same roundings as
    _quantize_block: one IEEE division per row, then multiplies, round half to even)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    r16 = tl.arange(0, 16)
    h = tl.load(h_ptr + r16[:, None] * 16 + r16[None, :])
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, G):
        r, _ = _load_rotated(x_ptr, h, rows, k0, M, stride_xm, BLOCK_M, G)
        amax = _max_nan(amax, _row_absmax(r))
    inv, ok, scale = _row_scale(amax)
    tl.store(scale_ptr + rows, scale, mask=rows < M)
    q_row = q_ptr + rows[:, None].to(tl.int64) * stride_qm
    for k0 in range(0, K, G):
        r, cols = _load_rotated(x_ptr, h, rows, k0, M, stride_xm, BLOCK_M, G)
        tl.store(q_row + cols[None, :], _quantize_tile(r, inv[:, None], ok[:, None]), mask=rows[:, None] < M)


def build_rotated_launch(x, group: int, q=None, scale=None) -> tuple:
    """(kernel, grid, args, kwargs) quantizing x [M, K] rotated by H_group (group in ROTATION_GROUPS, K % group
    == 0). Device-free (the offline compile check builds it from CPU tensors)."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=torch.int8, device=x.device) if q is None else q
    scale = torch.empty((M,), dtype=torch.float32, device=x.device) if scale is None else scale
    block_m = 16
    args = (x, _h16(x.device), q, scale, M, K, x.stride(0), q.stride(0), block_m, group)
    return _quantize_rotated_kernel, (triton.cdiv(M, block_m),), args, dict(num_warps=4)


@functools.lru_cache(maxsize=8)
def _h16(device: torch.device) -> torch.Tensor:
    from .reference import hadamard

    return hadamard(16, torch.float32, device).contiguous()


def quantize_rotated_rows_triton(x: torch.Tensor, group: int):
    """x [M, K] (unit column stride) -> (int8 [M, K], float32 [M]) of x rotated by ConvRot's H_group."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=torch.int8, device=x.device)
    scale = torch.empty((M,), dtype=torch.float32, device=x.device)
    if M:
        launch(*build_rotated_launch(x, group, q, scale))
    return q, scale


def pow2_split(k: int) -> tuple[int, int] | None:
    """(head, tail) with k = head + tail, head the largest power of two <= k and tail 0 or a power of two (4608 =
    4096 + 512, 12288 = 8192 + 4096): a row held as two register tiles without masked lanes. None for other k."""
    head = 1 << (k.bit_length() - 1)
    tail = k - head
    return (head, tail) if tail & (tail - 1) == 0 else None


def quant_launch_params(M: int, K: int) -> dict:
    """Launch heuristic, from H100 sweeps of the quantizer alone (GPU time, CUDA-graph replay):
    K = 4096 or 8192 + 2^j (Ideogram's 4608, 12288) in one pass from registers; other rows of up
    to 8 K elements two at a time in 1 K chunks read twice (the second pass hits L2),
    up to 16 K one row in 4 K chunks, long rows in 16 K chunks with 16 warps, two programs per SM."""
    if K <= 1024:
        block_k = triton.next_power_of_2(K)
        return dict(
            BLOCK_M=max(1, min(16, 4096 // block_k)),
            BLOCK_K=block_k,
            ONE_PASS=True,
            num_warps=4,
            PROGRAMS_PER_SM=0,
            NUM_STAGES=1,
            TAIL_K=0,
        )
    split = pow2_split(K)
    if split is not None and 4096 <= split[0] < K <= 16384:
        head, tail = split
        # K = 4096 or 8192 + a power of two (Ideogram's 4608 = 4096 + 512, 12288 = 8192 + 4096): one
        # pass, the row in registers as a head and a tail tile
        return dict(
            BLOCK_M=1,
            BLOCK_K=head,
            ONE_PASS=True,
            num_warps=4 if head == 4096 else 8,
            PROGRAMS_PER_SM=0,
            NUM_STAGES=1,
            TAIL_K=tail,
        )
    if K <= 8192:
        return dict(BLOCK_M=2, BLOCK_K=1024, ONE_PASS=False, num_warps=4, PROGRAMS_PER_SM=0, NUM_STAGES=1, TAIL_K=0)
    if K <= 16384:
        return dict(BLOCK_M=1, BLOCK_K=4096, ONE_PASS=False, num_warps=8, PROGRAMS_PER_SM=0, NUM_STAGES=1, TAIL_K=0)
    # Long rows (llm_cond_proj's 53248): two programs per SM walking the rows in 16 K chunks. With one
    # program per row all 512 rows (54 MB) are in flight at once and the second pass misses L2
    # (docs/design/measurements.md).
    return dict(BLOCK_M=1, BLOCK_K=16384, ONE_PASS=False, num_warps=16, PROGRAMS_PER_SM=2, NUM_STAGES=1, TAIL_K=0)


def _programs(M: int, block_m: int, per_sm: int, num_sms: int | None) -> int:
    blocks = triton.cdiv(M, block_m)
    if per_sm <= 0 or not num_sms:
        return blocks
    return min(blocks, num_sms * per_sm)


def build_launch(x, smooth=None, params=None, num_sms=None, q=None, scale=None, codes=torch.int8) -> tuple:
    """(kernel, grid, args, kwargs) quantizing x [M, K] into q / scale (new ones when None; ``codes``: their
    type, int8 or float8_e4m3fn, which q's type sets when given). Device-free: the offline compile check
    builds it from CPU tensors (``num_sms`` stands in for the device's)."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=codes, device=x.device) if q is None else q
    scale = torch.empty((M,), dtype=torch.float32, device=x.device) if scale is None else scale
    if num_sms is None and x.device.type == "cuda":
        num_sms = sm_count(x.device)
    if params:
        plan = _as_plan(M, {**quant_launch_params(M, K), **params}, num_sms)
    else:
        plan = _plan(M, K, num_sms)
    grid, block_m, block_k, one_pass, stages, warps, tail_k = plan
    args = (
        x,
        smooth if smooth is not None else x,
        q,
        scale,
        M,
        K,
        x.stride(0),
        q.stride(0),
        smooth is not None,
        block_m,
        block_k,
        one_pass,
        stages,
        tail_k,
    )
    return _quantize_rows_kernel, (grid,), args, dict(num_warps=warps)


def quantize_rows_triton(
    x: torch.Tensor, smooth: torch.Tensor | None = None, params: dict | None = None, codes=torch.int8
):
    """x [M, K] (row stride arbitrary, unit column stride) -> (codes [M, K], float32 [M]); ``codes``:
    torch.int8 (scale = absmax / 127) or torch.float8_e4m3fn (absmax / 448).

    ``params`` overrides the launch heuristic (benchmark sweeps)."""
    M, K = x.shape
    q = torch.empty((M, K), dtype=codes, device=x.device)
    scale = torch.empty((M,), dtype=torch.float32, device=x.device)
    if M == 0:
        return q, scale
    launch(*build_launch(x, smooth, params, q=q, scale=scale))
    return q, scale


@functools.lru_cache(maxsize=1024)
def _plan(M: int, K: int, num_sms: int | None) -> tuple:
    """The default heuristic's launch plan, cached (asked on every call)."""
    return _as_plan(M, quant_launch_params(M, K), num_sms)


def _as_plan(M: int, p: dict, num_sms: int | None) -> tuple:
    """(programs, BLOCK_M, BLOCK_K, ONE_PASS, NUM_STAGES, num_warps, TAIL_K) of launch params ``p``."""
    return (
        _programs(M, p["BLOCK_M"], p["PROGRAMS_PER_SM"], num_sms),
        p["BLOCK_M"],
        p["BLOCK_K"],
        p["ONE_PASS"],
        p["NUM_STAGES"],
        p["num_warps"],
        p["TAIL_K"],
    )
