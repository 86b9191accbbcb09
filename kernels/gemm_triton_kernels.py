"""The portable Triton kernels of the W8A8 GEMM (host side: gemm_triton.py, which states the contract).

``_w8a8_gemm_kernel`` (pointers; EPILOGUE raw int32 / dequant + bias / split-K partial),
``_w8a8_gemm_persistent_kernel`` (TMA descriptors, persistent), the SwiGLU gate/up pair from two weights
(``_gate_up_kernel``, ``_gate_up_persistent_kernel``), the split-K reduce (``_split_k_epilogue_kernel``) and
the device helpers they share.

Design notes:
* The weight stays [N, K] with K contiguous and is read as a K-major B operand: an N-major int8
  B operand costs Hopper ~10x (8-bit MMA fragments pack K, ldmatrix.trans is 16-bit only).
* Hopper emits int8 wgmma only for BLOCK_M % 64 == 0, num_warps % 4 == 0, BLOCK_K >= 32; other
  configs compile to mma.sync (the Ampere instruction), which is how GPU tests cover Ampere code.
* Grouped program order (GROUP_M) keeps a band of A rows and W columns hot in L2.
* SPLIT_K > 1 (for the long-K, small-M ``llm_cond_proj``): each K slice stores its int32 partial
  tile into its own slice of a [SPLIT_K, M, N] workspace (plain stores: no zeroing, no atomics,
  which cost more than the split saved), then one small kernel sums the slices and applies the
  scales and bias. Integer addition is exact, so the result is bit-identical to SPLIT_K == 1.
* SwiGLU gate/up (``_gate_up_kernel``, ``_gate_up_persistent_kernel``): the gate and up tiles are read from the two
  weights w1 / w3 as they are, two dots per k step into a gate and an up accumulator, and ``_gate_up_epilogue``
  writes silu(g) * u in float32 (every kernel and tile gives the same result bit for bit).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _column_halves(t, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A [BLOCK_M, BLOCK_N] tile as its left and right [BLOCK_M, BLOCK_N // 2] halves."""
    return tl.split(tl.permute(tl.reshape(t, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def _dequant_tile(acc, sa_ptr, sb_ptr, bias_ptr, rm, rn, M, N, HAS_BIAS: tl.constexpr):
    """The epilogue of the numerics contract, in float32: (acc * s_tok[m]) * s_ch[n] + bias[n]."""
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)
    y = acc.to(tl.float32) * sa[:, None]
    y = y * sb[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _w8a8_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_bn,
    stride_cm,
    K_PER_SPLIT,
    HAS_BIAS: tl.constexpr,
    EPILOGUE: tl.constexpr,  # 0: raw int32 store, 1: scaled store, 2: split-K partial store
    EVEN_K: tl.constexpr,  # K_PER_SPLIT % BLOCK_K == 0 and K % K_PER_SPLIT == 0: no K masks
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows/cols past the edge are wrapped onto valid ones instead of masked: the loads stay
    # unmasked along M/N (cheaper), and the store mask drops the duplicates.
    ram = rm % M
    rbn = rn % N
    k_start = pid_k * K_PER_SPLIT
    rk = k_start + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + ram[:, None].to(tl.int64) * stride_am + rk[None, :]
    b_ptrs = b_ptr + rbn[None, :].to(tl.int64) * stride_bn + rk[:, None]

    # e4m3 codes (kernels.fp8_linear) accumulate in float32 (Hopper's fp8 MMA keeps fewer mantissa bits: the
    # numerics contract of that path allows it), int8 codes in exact int32
    FP8: tl.constexpr = a_ptr.dtype.element_ty == tl.float8e4nv
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32 if FP8 else tl.int32)
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = k_end - k0
            a = tl.load(a_ptrs, mask=(rk[None, :] - k_start) < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=(rk[:, None] - k_start) < k_left, other=0.0)
        # FP8 accumulates inside the MMA chain: `acc += dot` made Hopper promote at every k step, far slower
        # (docs/performance.md, "FP8 for the protected layers")
        if FP8:
            acc = tl.dot(a, b, acc)
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    if EPILOGUE == 0:
        tl.store(c_ptrs, acc, mask=c_mask)
    elif EPILOGUE == 2:
        # this split's slice of the [SPLIT_K, M, N] workspace (stride_cm == N)
        tl.store(c_ptrs + pid_k.to(tl.int64) * M * stride_cm, acc, mask=c_mask)
    else:
        y = _dequant_tile(acc, sa_ptr, sb_ptr, bias_ptr, rm, rn, M, N, HAS_BIAS)
        tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _gate_up_epilogue(acc_g, acc_u, sa_ptr, s1_ptr, s3_ptr, rm, rh, M, F):
    """silu(g) * u of the two int32 accumulators in float32: g and u dequantized as ``_dequant_tile`` does
    ((acc * s_tok[m]) * s_ch[f]), then g * sigmoid(g) * u (the Gluon pair's epilogue: the same ops in the same
    order)."""
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    g = acc_g.to(tl.float32) * sa[:, None]
    g = g * tl.load(s1_ptr + rh, mask=rh < F, other=0.0)[None, :]
    u = acc_u.to(tl.float32) * sa[:, None]
    u = u * tl.load(s3_ptr + rh, mask=rh < F, other=0.0)[None, :]
    return g * tl.sigmoid(g) * u


@triton.jit
def _gate_up_kernel(
    a_ptr,
    w1_ptr,
    w3_ptr,
    c_ptr,
    sa_ptr,
    s1_ptr,
    s3_ptr,
    M,
    F,
    K,
    stride_am,
    stride_w1,
    stride_w3,
    stride_cm,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K masks
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # gate + up columns of one tile: BLOCK_N // 2 of each, BLOCK_N // 2 outputs
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """SwiGLU gate/up pair from two weights: out[m, f] = silu(g) * u, g = q . w1[f], u = q . w3[f] (each
    dequantized with its own per-channel scale). Two dots per k step into two accumulators; a tile reads
    BLOCK_N // 2 rows of each weight (the shared memory of a ``_w8a8_gemm_kernel`` tile of width BLOCK_N). F
    needs no alignment: rows past F are wrapped onto valid ones (loads stay unmasked) and dropped by the store
    mask."""
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(F, HALF)
    pid_m, pid_n = _tile_coords(pid, GROUP_M * num_pid_n, num_pid_m, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rh = pid_n * HALF + tl.arange(0, HALF)
    ram = rm % M
    rwh = (rh % F).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + ram[:, None].to(tl.int64) * stride_am + rk[None, :]
    g_ptrs = w1_ptr + rwh[None, :] * stride_w1 + rk[:, None]
    u_ptrs = w3_ptr + rwh[None, :] * stride_w3 + rk[:, None]
    acc_g = tl.zeros((BLOCK_M, HALF), dtype=tl.int32)
    acc_u = tl.zeros((BLOCK_M, HALF), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            g = tl.load(g_ptrs)
            u = tl.load(u_ptrs)
        else:
            k_left = K - k0
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0)
            g = tl.load(g_ptrs, mask=rk[:, None] < k_left, other=0)
            u = tl.load(u_ptrs, mask=rk[:, None] < k_left, other=0)
        acc_g += tl.dot(a, g)
        acc_u += tl.dot(a, u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    h = _gate_up_epilogue(acc_g, acc_u, sa_ptr, s1_ptr, s3_ptr, rm, rh, M, F)
    h_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rh[None, :]
    tl.store(h_ptrs, h.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rh[None, :] < F))


@triton.jit
def _tile_coords(tile_id, num_pid_in_group, num_pid_m, GROUP_M: tl.constexpr):
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _w8a8_gemm_persistent_kernel(
    a_desc,
    b_desc,
    c_desc,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    RAW_INT32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    SUBTILE: tl.constexpr,
):
    """Persistent variant: one program per SM walks the output tiles; A/B/C move by TMA
    descriptors (edge tiles are zero-filled on load and clipped on store, so no masks).
    The epilogue of one tile overlaps the next tile's loads."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_in_group, num_pid_m, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
        if RAW_INT32:
            if SUBTILE:
                acc0, acc1 = _column_halves(acc, BLOCK_M, BLOCK_N)
                c_desc.store([off_m, off_n], acc0)
                c_desc.store([off_m, off_n + BLOCK_N // 2], acc1)
            else:
                c_desc.store([off_m, off_n], acc)
        else:
            rm = off_m + tl.arange(0, BLOCK_M)
            rn = off_n + tl.arange(0, BLOCK_N)
            y = _dequant_tile(acc, sa_ptr, sb_ptr, bias_ptr, rm, rn, M, N, HAS_BIAS)
            out_ty = c_desc.dtype
            if SUBTILE:
                # two half-width stores: smaller epilogue staging buffer, more overlap
                y0, y1 = _column_halves(y, BLOCK_M, BLOCK_N)
                c_desc.store([off_m, off_n], y0.to(out_ty))
                c_desc.store([off_m, off_n + BLOCK_N // 2], y1.to(out_ty))
            else:
                c_desc.store([off_m, off_n], y.to(out_ty))


@triton.jit
def _gate_up_persistent_kernel(
    a_desc,
    w1_desc,
    w3_desc,
    c_desc,
    sa_ptr,
    s1_ptr,
    s3_ptr,
    M,
    F,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # gate + up: the descriptors' boxes are BLOCK_N // 2 rows of each
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
):
    """``_gate_up_kernel`` as a persistent TMA kernel (the SwiGLU form of ``_w8a8_gemm_persistent_kernel``):
    per k step one A box and a BLOCK_N // 2-row box of each weight; edge boxes zero-filled, stores clipped."""
    HALF: tl.constexpr = BLOCK_N // 2
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(F, HALF)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_in_group, num_pid_m, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_h = pid_n * HALF
        acc_g = tl.zeros((BLOCK_M, HALF), dtype=tl.int32)
        acc_u = tl.zeros((BLOCK_M, HALF), dtype=tl.int32)
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            g = w1_desc.load([off_h, ki * BLOCK_K])
            u = w3_desc.load([off_h, ki * BLOCK_K])
            acc_g = tl.dot(a, g.T, acc_g, out_dtype=tl.int32)
            acc_u = tl.dot(a, u.T, acc_u, out_dtype=tl.int32)
        rm = off_m + tl.arange(0, BLOCK_M)
        rh = off_h + tl.arange(0, HALF)
        h = _gate_up_epilogue(acc_g, acc_u, sa_ptr, s1_ptr, s3_ptr, rm, rh, M, F)
        c_desc.store([off_m, off_h], h.to(c_desc.dtype))


@triton.jit
def _split_k_epilogue_kernel(
    acc_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    stride_cm,
    SPLITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RAW_INT32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Sum the SPLITS int32 partial slices of a [SPLITS, M, N] workspace, then store the raw sum
    (RAW_INT32) or the dequantized, biased result. SPLITS == 1 is the cuBLAS path's epilogue."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.load(acc_ptr + offs, mask=mask, other=0)
    for s in tl.static_range(1, SPLITS):  # unrolled: every slice's load in flight at once
        # s is a Python int here, and so is M where the launch specialized M == 1 (one row: a modulation vector)
        acc += tl.load(acc_ptr + tl.full([], s, tl.int64) * M * N + offs, mask=mask, other=0)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    if RAW_INT32:
        tl.store(c_ptrs, acc, mask=mask)
    else:
        y = _dequant_tile(acc, sa_ptr, sb_ptr, bias_ptr, rm, rn, M, N, HAS_BIAS)
        tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=mask)
