"""Fused W8A8 GEMM in Triton: int8 x int8 -> int32 on tensor cores, dequant + bias epilogue.

    out[m, n] = out_dtype((float(acc[m, n]) * s_tok[m]) * s_ch[n] + bias[n]),
    acc[m, n] = sum_k q[m, k] * w[n, k]            (q: [M, K] int8, w: [N, K] int8, K-contiguous)

Twin: ``reference.int8_matmul_ref`` / ``reference.int8_matmul_int32_ref``.

Design notes (facts in research/int8-gemm-sota.md):
* The weight stays [N, K] with K contiguous and is read as a K-major B operand: an N-major int8
  B operand costs Hopper ~10x (8-bit MMA fragments pack K, ldmatrix.trans is 16-bit only).
* Hopper emits int8 wgmma only for BLOCK_M % 64 == 0, num_warps % 4 == 0, BLOCK_K >= 32; other
  configs compile to mma.sync (the Ampere instruction), which is how GPU tests cover Ampere code.
* Grouped program order (GROUP_M) keeps a band of A rows and W columns hot in L2.
* SPLIT_K > 1 (for the long-K, small-M ``llm_cond_proj``): each K slice stores its int32 partial
  tile into its own slice of a [SPLIT_K, M, N] workspace (plain stores: no zeroing, no atomics,
  which cost more than the split saved), then one small kernel sums the slices and applies the
  scales and bias. Integer addition is exact, so the result is bit-identical to SPLIT_K == 1.
* SwiGLU gate/up: with w1 / w3 rows interleaved in one tensor (EPILOGUE 3, ``_swiglu_tile``), or read from the two
  weights as they are (``_gate_up_kernel``, ``_gate_up_persistent_kernel``: two dots per k step into a gate and an
  up accumulator, the same float32 epilogue ops in the same order, so the same result bit for bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .env import sm_count
from .launch import launch

# The compiled kernel of the last launch (tests read its PTX to check wgmma vs mma.sync).
LAST_LAUNCH: dict = {}


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
def _swiglu_tile(y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y [BLOCK_M, BLOCK_N] holds gate columns then up columns (weights interleaved in chunks of
    BLOCK_N // 2): returns silu(gate) * up, [BLOCK_M, BLOCK_N // 2], in float32."""
    g, u = _column_halves(y, BLOCK_M, BLOCK_N)
    return g * tl.sigmoid(g) * u


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
    EPILOGUE: tl.constexpr,  # 0: raw int32 store, 1: scaled store, 2: split-K partial store, 3: SwiGLU
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

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    k_end = tl.minimum(k_start + K_PER_SPLIT, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = k_end - k0
            a = tl.load(a_ptrs, mask=(rk[None, :] - k_start) < k_left, other=0)
            b = tl.load(b_ptrs, mask=(rk[:, None] - k_start) < k_left, other=0)
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
        if EPILOGUE == 3:
            h = _swiglu_tile(y, BLOCK_M, BLOCK_N)
            rh = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            h_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rh[None, :]
            tl.store(h_ptrs, h.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rh[None, :] < N // 2))
        else:
            tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _gate_up_epilogue(acc_g, acc_u, sa_ptr, s1_ptr, s3_ptr, rm, rh, M, F):
    """silu(g) * u of the two int32 accumulators, with g and u dequantized exactly as ``_dequant_tile``
    does and combined exactly as ``_swiglu_tile`` does (same float32 ops, same order): bit for bit the
    interleaved kernel's result for the same operands."""
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
    dequantized with its own per-channel scale). Two dots per k step into two accumulators; the shared
    memory and tile of one ``_w8a8_gemm_kernel`` SwiGLU tile of width BLOCK_N. F needs no alignment: rows
    past F are wrapped onto valid ones (loads stay unmasked) and dropped by the store mask."""
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
    SWIGLU: tl.constexpr,
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
            if SWIGLU:
                c_desc.store([off_m, off_n // 2], _swiglu_tile(y, BLOCK_M, BLOCK_N).to(out_ty))
            elif SUBTILE:
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
        acc += tl.load(acc_ptr + (s * M).to(tl.int64) * N + offs, mask=mask, other=0)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    if RAW_INT32:
        tl.store(c_ptrs, acc, mask=mask)
    else:
        y = _dequant_tile(acc, sa_ptr, sb_ptr, bias_ptr, rm, rn, M, N, HAS_BIAS)
        tl.store(c_ptrs, y.to(c_ptr.dtype.element_ty), mask=mask)


def _k_split(K: int, cfg) -> tuple[int, bool]:
    """K range per split (a multiple of BLOCK_K) and whether no K masking is needed."""
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.split_k), cfg.block_k) * cfg.block_k
    even_k = K % k_per_split == 0 and k_per_split % cfg.block_k == 0
    return k_per_split, even_k


def tma_problem(*tensors) -> str | None:
    """None when TMA descriptors can address every 2-D operand (16-byte aligned bases and row
    strides, unit inner stride), else why not. Asked on every launch: a plain loop."""
    for t in tensors:
        if t.dim() != 2 or t.stride(1) != 1 or t.data_ptr() & 15 or (t.stride(0) * t.element_size()) & 15:
            return f"TMA cannot address a {t.dtype} operand of shape {tuple(t.shape)}, strides {t.stride()}"
    return None


def build_launches(
    q, w, cfg, q_scale=None, w_scale=None, bias=None, out=None, raw_int32=False, swiglu=False, num_sms=None, up=None
) -> list[tuple]:
    """[(kernel, grid, args, kwargs)] of one portable GEMM (config kernel ``triton`` or ``triton-tma``), in
    launch order: the GEMM, then (split-K) the reduce. Device-free: the offline compile check builds the
    same launches from CPU tensors. A ``triton-tma`` config whose operands TMA cannot address gets the
    pointer kernel with its tile. ``up = (w3, s3)``: the SwiGLU gate/up pair from two weights (``w`` is the
    gate w1 [F, K], ``w_scale`` its scale; ``out`` [M, F]); see ``gate_up_launch``. Misuse raises ValueError."""
    if up is not None:
        return [gate_up_launch(q, w, w_scale, up[0], up[1], cfg, q_scale, bias, out, raw_int32, swiglu, num_sms)]
    M, K = q.shape
    N = w.shape[0]
    why = cfg.problem(out.element_size(), swiglu) if cfg.kernel in ("triton", "triton-tma") else "not portable"
    if why is None and swiglu and (raw_int32 or N % cfg.block_n):
        why = "the SwiGLU epilogue needs a float output and N a multiple of BLOCK_N"
    if why:
        raise ValueError(f"{cfg.key()}: {why}")
    if cfg.kernel == "triton-tma" and tma_problem(q, w, out) is None:
        return [_persistent_launch(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, swiglu, num_sms)]
    k_per_split, even_k = _k_split(K, cfg)
    split_k = triton.cdiv(K, k_per_split)
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n), split_k)
    tiles = (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split_k == 1:
        epilogue = 0 if raw_int32 else 3 if swiglu else 1
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


def launch_gemm(q, w, cfg, q_scale=None, w_scale=None, bias=None, out=None, raw_int32=False, swiglu=False, up=None):
    """Run the portable kernel with config ``cfg``; writes into and returns ``out``.

    raw_int32=True returns the int32 accumulator (``out`` must be int32); otherwise ``out`` gets
    the dequantized, biased result in its own dtype. swiglu=True: ``w`` holds gate and up rows
    interleaved in chunks of BLOCK_N // 2 and ``out`` [M, N // 2] gets silu(gate) * up; or, with
    ``up = (w3, s3)``, ``w`` is the gate weight w1 [F, K] and w3 [F, K] the up weight (no interleaved
    copy), ``out`` [M, F].
    """
    for i, (kernel, grid, args, kwargs) in enumerate(
        build_launches(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, swiglu, up=up)
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


def _persistent_launch(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, swiglu, num_sms=None) -> tuple:
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = q.shape
    N = w.shape[0]
    subtile = bool(cfg.subtile) and not swiglu
    c_block_n = cfg.block_n // 2 if (subtile or swiglu) else cfg.block_n
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
        swiglu,
        cfg.block_m,
        cfg.block_n,
        cfg.block_k,
        cfg.group_m,
        programs,
        subtile,
    )
    return _w8a8_gemm_persistent_kernel, (programs,), args, dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def gate_up_launch(
    q, w1, s1, w3, s3, cfg, q_scale, bias=None, out=None, raw_int32=False, swiglu=True, num_sms=None
) -> tuple:
    """(kernel, grid, args, kwargs) of the SwiGLU gate/up pair read from two weights w1, w3 [F, K] (per-channel
    scales s1, s3 [F]): out [M, F] = silu(g) * u. The config's tile is that of the interleaved SwiGLU epilogue
    (BLOCK_N // 2 rows of each weight per tile: same shared memory, same MMA shape); F needs no alignment.
    ``triton-tma`` runs the persistent TMA kernel where TMA can address every operand, else the pointer kernel
    with its tile. Misuse raises ValueError."""
    M, K = q.shape
    F = w1.shape[0]
    why = cfg.problem(out.element_size(), swiglu=True) if cfg.kernel in ("triton", "triton-tma") else "not portable"
    if why is None and (raw_int32 or not swiglu or bias is not None):
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
