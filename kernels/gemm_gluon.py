"""W8A8 GEMM for Hopper (sm_90a) written in Gluon: explicit TMA / mbarrier / async wgmma.

Same contract as ``gemm_triton`` (twin: ``reference.int8_matmul_ref``)::

    acc[m, n] = sum_k q[m, k] * w[n, k]                     (int8 x int8 -> int32)
    out[m, n] = out_dtype((float32(acc) * s_tok[m]) * s_ch[n] + bias[n])   (or acc itself: RAW_INT32)

SWIGLU (no bias, not RAW_INT32, N % BLOCK_N == 0): ``w`` [N, K] holds gate and up rows
interleaved in chunks of BLOCK_N // 2 (dispatch.interleave_gate_up), so output tile (pid_m, pid_n)
has gate columns in its left half and the matching up columns in its right half; with y as above
(float32), out [M, N // 2] gets, at columns pid_n * BLOCK_N // 2 + [0, BLOCK_N // 2)::

    out = out_dtype(g * sigmoid(g) * u),   sigmoid(g) = 1 / (1 + exp(-g))

exactly the float32 ops of gemm_triton._swiglu_tile (twin: F.silu(g) * u in float32).

PAIR (the SwiGLU gate/up pair from two weights, ``launch_gemm(..., up=(w3, s3))``): ``w`` is the gate w1 [F, K]
and w3 [F, K] the up weight, each with its own scale vector, out [M, F]; no interleaved copy exists (ComfyUI
MODELs keep w1 and w3 as two parameters). The kernel keeps the interleaved epilogue's shared memory, ring and
wgmma shape: each stage still holds one B tile [BLOCK_N, BLOCK_K], which the producer fills with two TMA boxes
of BLOCK_N // 2 rows (rows f.. of w1 into the top half, the same rows of w3 into the bottom half: one mbarrier,
the same byte count), so the consumers' wgmma over the whole tile produces gate columns on the left and up
columns on the right exactly as with interleaved weights, and the epilogue reads the up scales from their own
vector. A second B ring (or two accumulators) would need more shared memory or change the wgmma issue; two
boxes into halves of the same tile change only the loader. N is F for the tile grid; F need not be a multiple
of BLOCK_N // 2 (TMA zero-fills rows past F and clips the stores, scale loads are masked).

One warp-specialized persistent kernel, two schedules (``GemmConfig.kernel``):

* ``gluon-ws`` (cooperative): a 1-warp producer issues TMA loads into a NUM_STAGES smem ring
  (ready/empty mbarriers); two 4-warp consumer warpgroups each own BLOCK_M / 2 rows of every tile,
  run async wgmma and their own epilogue. Consumers get most of the register file (setmaxnreg).
* ``gluon-pingpong``: each consumer warpgroup owns whole tiles, alternating; one warpgroup's
  epilogue overlaps the other's main loop (the ring serializes their loads).

Split-K (``split_k`` > 1, not with SwiGLU): the persistent loop walks tiles x S work units,
split-major (unit = split * tiles + tile); a unit covers the k steps [s * KPS, min(k_tiles,
(s + 1) * KPS)) with KPS = cdiv(k_tiles, split_k) and S = cdiv(k_tiles, KPS), so no split is empty.
Each unit TMA-stores its exact int32 partial into ws [S, M, N] through a 3-D descriptor (box
[1, rows, epi_n]; rows past M clip inside the slice), and gemm_triton.reduce_partials sums the
slices and applies scales + bias (or keeps the int32 sum). Producer and consumers derive the same
ring positions (``_unit_slot``), so the mbarrier phases stay consistent across units of different
lengths.

Hopper facts the design leans on (checked with the offline compile, .ci/compile_kernels.py):
* The weight [N, K] is K-contiguous: its smem tile [BLOCK_N, BLOCK_K] permuted to [BLOCK_K, BLOCK_N]
  is the K-major B operand int8 wgmma needs (no transposed copy).
* Triton lowers int8 wgmma only up to n = 224, so BLOCK_N = 256 runs as m64n128k32 instructions.
* mbarrier.arrive in a partition is a partition-wide bar.sync followed by one thread's arrive:
  one arrive per consumer warpgroup, so the cooperative ring's empty barriers count 2.

Only public Gluon API is used; the names that moved between Triton releases are bound once below
(``_tma_load``, ``_tma_store``, ``_warp_specialize``). Which Triton lines may run this module is
decided in ``backends.py``.
"""

from __future__ import annotations

import functools

import torch

from .configs import GLUON_CONSUMER_REGS, GLUON_LOADER_REGS, GemmConfig, gluon_epi_bufs, gluon_instr_n
from .configs import gluon_rows_per_consumer as _rows
from .env import sm_count
from .launch import launch

try:  # Gluon ships with triton >= 3.5; the pack must import without it.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # renamed in later Triton releases: the old name where it still exists
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _warp_specialize = gl.warp_specialize
    IMPORT_ERROR = None
except Exception as exc:  # pragma: no cover - depends on the installed triton
    IMPORT_ERROR = f"triton.experimental.gluon (Hopper) is not importable: {type(exc).__name__}: {exc}"

# The compiled kernel of the last launch (tests read its PTX).
LAST_LAUNCH: dict = {}


# ---------------------------------------------------------------------------------------------
# device code
# ---------------------------------------------------------------------------------------------

if IMPORT_ERROR is None:

    @gluon.jit
    def _tile_coords(tile_id, num_pid_in_group, num_pid_m, GROUP_M: gl.constexpr):
        # grouped order, identical to gemm_triton._tile_coords
        group_id = tile_id // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = gl.minimum(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + (tile_id % group_size_m)
        pid_n = (tile_id % num_pid_in_group) // group_size_m
        return pid_m, pid_n

    @gluon.jit
    def _unit(u, tiles, num_pid_in_group, num_pid_m, k_tiles, KPS, GROUP_M: gl.constexpr, SPLIT_K: gl.constexpr):
        """Work unit u -> (pid_m, pid_n, split, first k step, k steps). Split-major: unit
        u = split * tiles + tile, so the CTAs of a wave share K ranges (A and B panels in L2).
        SPLIT_K is the effective split count: every split has >= 1 k step, only the last may be
        shorter (the host makes KPS = cdiv(k_tiles, S) and S = cdiv(k_tiles, KPS))."""
        if SPLIT_K == 1:
            pid_m, pid_n = _tile_coords(u, num_pid_in_group, num_pid_m, GROUP_M)
            split = 0
            k0 = 0
            nk = k_tiles
        else:
            split = u // tiles
            pid_m, pid_n = _tile_coords(u - split * tiles, num_pid_in_group, num_pid_m, GROUP_M)
            k0 = split * KPS
            nk = gl.minimum(k_tiles - k0, KPS)
        return pid_m, pid_n, split, k0, nk

    @gluon.jit
    def _unit_slot(j, pid, nprog, tiles, k_tiles, KPS, SPLIT_K: gl.constexpr):
        """Ring position of the first k step of this CTA's j-th unit: the k steps of its units
        0 .. j-1 (units pid + i * nprog), in the loader's order. Every unit has KPS steps but
        those of the last split, k_tiles - (SPLIT_K - 1) * KPS."""
        if SPLIT_K == 1:
            slot = j * k_tiles
        else:
            last0 = (SPLIT_K - 1) * tiles  # first unit of the last split
            i0 = gl.cdiv(gl.maximum(last0 - pid, 0), nprog)  # first local index in the last split
            n_last = gl.maximum(j - i0, 0)
            slot = j * KPS - n_last * (KPS - (k_tiles - (SPLIT_K - 1) * KPS))
        return slot

    @gluon.jit
    def _stage_store(val, desc, coord, buf, NBUF: gl.constexpr):
        """val -> smem staging ``buf`` -> global at ``coord`` through ``desc`` (TMA store). Waits
        first until the store that last used ``buf`` has read it (NBUF buffers alternate); this
        store stays in flight."""
        tma.store_wait(NBUF - 1)
        buf.reshape(val.shape).store(val)  # a [1, R, C] box of the 3-D workspace takes [R, C]
        fence_async_shared()
        _tma_store(desc, coord, buf)

    @gluon.jit
    def _store_partial(acc, c_desc, c_bufs, split, off_m, off_n, BUF0: gl.constexpr, NBUF: gl.constexpr):
        """Split-K: the int32 partial acc [ROWS, BLOCK_N] -> ws[split, off_m:, off_n:] through a
        3-D TMA descriptor over ws [S, M, N] (box [1, ROWS, EPI_N]): rows past M are clipped at
        M, never written into the next slice."""
        BLOCK_N: gl.constexpr = acc.shape[1]
        EPI_N: gl.constexpr = c_bufs.shape[3]
        SPLITS: gl.constexpr = BLOCK_N // EPI_N
        parts = _split_n(acc, SPLITS)
        for i in gl.static_range(SPLITS):
            _stage_store(parts[i], c_desc, [split, off_m, off_n + i * EPI_N], c_bufs.index(BUF0 + i % NBUF), NBUF)

    @gluon.jit
    def _split_n(x, SPLITS: gl.constexpr):
        """[R, C] -> tuple of SPLITS column blocks [R, C // SPLITS], left to right. The column
        bits split off are register bits of the wgmma layout, so no data moves."""
        xs = (x,)
        for _ in gl.static_range(SPLITS.bit_length() - 1):
            nxt = ()
            for j in gl.static_range(len(xs)):
                t = xs[j]
                nxt += t.reshape(t.shape[0], 2, t.shape[1] // 2).permute(0, 2, 1).split()
            xs = nxt
        return xs

    @gluon.jit
    def _sigmoid(x):
        # the body of tl.sigmoid (triton/language/standard.py): same ops, same PTX
        return 1 / (1 + gl.exp(-x))

    @gluon.jit
    def _epilogue(
        acc,
        c_desc,
        c_bufs,
        sa_ptr,
        sb_ptr,
        sb2_ptr,
        bias_ptr,
        off_m,
        off_n,
        M,
        N,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        PAIR: gl.constexpr,
        BUF0: gl.constexpr,
        NBUF: gl.constexpr,
    ):
        """acc [ROWS, BLOCK_N] -> out[off_m:, off_n:] in EPI_N-wide TMA stores through the staging
        buffers c_bufs[BUF0 : BUF0 + NBUF]. The last stores stay in flight (the caller waits
        before the buffers are reused). SWIGLU: out[off_m:, off_n // 2:] gets BLOCK_N // 2
        columns, silu(left half) * right half. PAIR (SWIGLU from two weights): off_n is the output
        column (= the gate / up row of w1 / w3), N = F, gate scales at sb_ptr, up scales at sb2_ptr."""
        ROWS: gl.constexpr = acc.shape[0]
        BLOCK_N: gl.constexpr = acc.shape[1]
        EPI_N: gl.constexpr = c_bufs.shape[2]
        SPLITS: gl.constexpr = BLOCK_N // EPI_N
        parts = _split_n(acc, SPLITS)
        if SWIGLU:
            HALF: gl.constexpr = SPLITS // 2  # subtiles per half: parts[i] gate, parts[HALF + i] up
            lay: gl.constexpr = parts[0].type.layout
            rm = off_m + gl.arange(0, ROWS, layout=gl.SliceLayout(1, lay))
            sa = gl.expand_dims(gl.load(sa_ptr + rm, mask=rm < M, other=0.0), 1)
            for i in gl.static_range(HALF):
                rg = off_n + i * EPI_N + gl.arange(0, EPI_N, layout=gl.SliceLayout(0, lay))
                sg = gl.load(sb_ptr + rg, mask=rg < N, other=0.0)
                if PAIR:  # up row f of w3 has its own scale vector
                    su = gl.load(sb2_ptr + rg, mask=rg < N, other=0.0)
                    col = off_n + i * EPI_N
                else:  # interleaved: the up rows are the tile's right half
                    ru = rg + BLOCK_N // 2
                    su = gl.load(sb_ptr + ru, mask=ru < N, other=0.0)
                    col = off_n // 2 + i * EPI_N
                # _dequant_tile, then _swiglu_tile of gemm_triton, op for op in float32
                g = parts[i].to(gl.float32) * sa
                g = g * gl.expand_dims(sg, 0)
                u = parts[HALF + i].to(gl.float32) * sa
                u = u * gl.expand_dims(su, 0)
                h = (g * _sigmoid(g) * u).to(c_desc.dtype)
                _stage_store(h, c_desc, [off_m, col], c_bufs.index(BUF0 + i % NBUF), NBUF)
        else:
            for i in gl.static_range(SPLITS):
                part = parts[i]
                if RAW_INT32:
                    y = part
                else:
                    rm = off_m + gl.arange(0, ROWS, layout=gl.SliceLayout(1, part.type.layout))
                    rn = off_n + i * EPI_N + gl.arange(0, EPI_N, layout=gl.SliceLayout(0, part.type.layout))
                    sa = gl.load(sa_ptr + rm, mask=rm < M, other=0.0)
                    sb = gl.load(sb_ptr + rn, mask=rn < N, other=0.0)
                    y = part.to(gl.float32) * gl.expand_dims(sa, 1)
                    y = y * gl.expand_dims(sb, 0)
                    if HAS_BIAS:
                        bias = gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32)
                        y = y + gl.expand_dims(bias, 0)
                    y = y.to(c_desc.dtype)
                _stage_store(y, c_desc, [off_m, off_n + i * EPI_N], c_bufs.index(BUF0 + i % NBUF), NBUF)

    # -- "ws" / "pingpong": warp specialized ----------------------------------------------------

    @gluon.jit
    def _ws_loader(
        a_desc,
        b_desc,
        b2_desc,
        a_bufs,
        b_bufs,
        ready,
        empty,
        KPS,
        GROUP_M: gl.constexpr,
        SPLIT_K: gl.constexpr,
        PAIR: gl.constexpr,
    ):
        """TMA producer. PAIR: a stage's B tile [BLOCK_N, BLOCK_K] is filled by two boxes of BLOCK_N // 2
        rows, the gate rows from w1 (b_desc) on top and the same rows of w3 (b2_desc) below: the tile the
        interleaved layout would hold, without an interleaved copy of the weights."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]  # PAIR: the rows of one weight per tile
        NUM_STAGES: gl.constexpr = a_bufs.shape[0]
        M = a_desc.shape[0]
        K = a_desc.shape[1]
        N = b_desc.shape[0]
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_pid_in_group = GROUP_M * num_pid_n
        k_tiles = gl.cdiv(K, BLOCK_K)
        tiles = num_pid_m * num_pid_n
        my_units = gl.cdiv(tiles * SPLIT_K - pid, nprog)
        if PAIR:
            nbytes: gl.constexpr = a_desc.block_type.nbytes + 2 * b_desc.block_type.nbytes
        else:
            nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
        slot = 0
        for j in range(my_units):
            pid_m, pid_n, split, k0, nk = _unit(
                pid + j * nprog, tiles, num_pid_in_group, num_pid_m, k_tiles, KPS, GROUP_M, SPLIT_K
            )
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            for kk in range(k0, k0 + nk):
                s = slot % NUM_STAGES
                # a fresh barrier passes a wait on parity 1: the first lap needs no release
                mbarrier.wait(empty.index(s), ((slot // NUM_STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, nbytes)
                _tma_load(a_desc, [off_m, kk * BLOCK_K], bar, a_bufs.index(s))
                if PAIR:
                    _tma_load(b_desc, [off_n, kk * BLOCK_K], bar, b_bufs.index(s).slice(0, BLOCK_N, dim=0))
                    _tma_load(b2_desc, [off_n, kk * BLOCK_K], bar, b_bufs.index(s).slice(BLOCK_N, BLOCK_N, dim=0))
                else:
                    _tma_load(b_desc, [off_n, kk * BLOCK_K], bar, b_bufs.index(s))
                slot += 1

    @gluon.jit
    def _ws_consumer(
        a_bufs,
        b_bufs,
        ready,
        empty,
        order,
        c_bufs,
        c_desc,
        sa_ptr,
        sb_ptr,
        sb2_ptr,
        bias_ptr,
        M,
        N,
        K,
        KPS,
        WG: gl.constexpr,
        PINGPONG: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        PAIR: gl.constexpr,
        GROUP_M: gl.constexpr,
        INSTR_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
    ):
        NUM_STAGES: gl.constexpr = a_bufs.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.shape[2]
        BLOCK_N: gl.constexpr = b_bufs.shape[1]
        if PAIR:  # a tile covers BLOCK_N // 2 rows of w1 and the same rows of w3 (N = F)
            TILE_N: gl.constexpr = BLOCK_N // 2
        else:
            TILE_N: gl.constexpr = BLOCK_N
        if SPLIT_K > 1:  # box [1, ROWS, EPI_N] of the workspace descriptor
            ROWS: gl.constexpr = c_desc.block_type.shape[1]
        else:
            ROWS: gl.constexpr = c_desc.block_type.shape[0]
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, INSTR_N, 32]
        )
        EPI_BUFS: gl.constexpr = c_bufs.shape[0] // 2

        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, TILE_N)
        num_pid_in_group = GROUP_M * num_pid_n
        k_tiles = gl.cdiv(K, BLOCK_K)
        tiles = num_pid_m * num_pid_n
        my_tiles = gl.cdiv(tiles * SPLIT_K - pid, nprog)  # work units: tiles x splits, every nprog-th
        # pingpong: warpgroup WG takes local tiles WG, WG + 2, ...; cooperative: rows WG * ROWS + [0, ROWS)
        first: gl.constexpr = WG if PINGPONG else 0
        step: gl.constexpr = 2 if PINGPONG else 1
        row0: gl.constexpr = 0 if PINGPONG else WG * ROWS

        acc = gl.zeros([ROWS, BLOCK_N], gl.int32, acc_layout)
        n = 0  # tiles this warpgroup has done
        slot = 0  # ring position of the next k step (the loader's order)
        for j in range(first, my_tiles, step):
            pid_m, pid_n, split, k0, nk = _unit(
                pid + j * nprog, tiles, num_pid_in_group, num_pid_m, k_tiles, KPS, GROUP_M, SPLIT_K
            )
            slot = _unit_slot(j, pid, nprog, tiles, k_tiles, KPS, SPLIT_K)
            if PINGPONG:
                # Main loops take turns (order[WG] completes when the other warpgroup's main loop
                # has issued its last wgmma). Besides pingponging the tensor cores, this keeps a
                # warpgroup from waiting on a ready barrier two laps ahead, where the parity test
                # would pass on a stale phase.
                if WG == 0:
                    mbarrier.wait(order.index(0), (n + 1) & 1, pred=n > 0)
                else:
                    mbarrier.wait(order.index(1), n & 1)
            for kk in range(nk):
                s = slot % NUM_STAGES
                mbarrier.wait(ready.index(s), (slot // NUM_STAGES) & 1)
                a = a_bufs.index(s)
                if not PINGPONG:
                    a = a.slice(row0, ROWS, dim=0)
                acc = warpgroup_mma(a, b_bufs.index(s).permute((1, 0)), acc, use_acc=kk > 0, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))
                # the previous step's wgmma has retired: hand its stage back to the loader
                mbarrier.arrive(empty.index((slot + NUM_STAGES - 1) % NUM_STAGES), pred=kk > 0)
                slot += 1
            if PINGPONG:
                mbarrier.arrive(order.index(1 - WG))
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index((slot + NUM_STAGES - 1) % NUM_STAGES))
            if SPLIT_K > 1:
                _store_partial(
                    acc, c_desc, c_bufs, split, pid_m * BLOCK_M + row0, pid_n * BLOCK_N, WG * EPI_BUFS, EPI_BUFS
                )
            else:
                _epilogue(
                    acc,
                    c_desc,
                    c_bufs,
                    sa_ptr,
                    sb_ptr,
                    sb2_ptr,
                    bias_ptr,
                    pid_m * BLOCK_M + row0,
                    pid_n * TILE_N,
                    M,
                    N,
                    HAS_BIAS,
                    RAW_INT32,
                    SWIGLU,
                    PAIR,
                    WG * EPI_BUFS,
                    EPI_BUFS,
                )
            n += 1
        tma.store_wait(0)

    # Partition entry points: the warpgroup index reaches _ws_consumer as a literal constexpr
    # (worker partition arguments are passed through IR block arguments).
    @gluon.jit
    def _ws_consumer0(
        a_bufs,
        b_bufs,
        ready,
        empty,
        order,
        c_bufs,
        c_desc,
        sa_ptr,
        sb_ptr,
        sb2_ptr,
        bias_ptr,
        M,
        N,
        K,
        KPS,
        PINGPONG: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        PAIR: gl.constexpr,
        GROUP_M: gl.constexpr,
        INSTR_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
    ):
        _ws_consumer(
            a_bufs,
            b_bufs,
            ready,
            empty,
            order,
            c_bufs,
            c_desc,
            sa_ptr,
            sb_ptr,
            sb2_ptr,
            bias_ptr,
            M,
            N,
            K,
            KPS,
            0,
            PINGPONG,
            HAS_BIAS,
            RAW_INT32,
            SWIGLU,
            PAIR,
            GROUP_M,
            INSTR_N,
            SPLIT_K,
        )

    @gluon.jit
    def _ws_consumer1(
        a_bufs,
        b_bufs,
        ready,
        empty,
        order,
        c_bufs,
        c_desc,
        sa_ptr,
        sb_ptr,
        sb2_ptr,
        bias_ptr,
        M,
        N,
        K,
        KPS,
        PINGPONG: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        PAIR: gl.constexpr,
        GROUP_M: gl.constexpr,
        INSTR_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
    ):
        _ws_consumer(
            a_bufs,
            b_bufs,
            ready,
            empty,
            order,
            c_bufs,
            c_desc,
            sa_ptr,
            sb_ptr,
            sb2_ptr,
            bias_ptr,
            M,
            N,
            K,
            KPS,
            1,
            PINGPONG,
            HAS_BIAS,
            RAW_INT32,
            SWIGLU,
            PAIR,
            GROUP_M,
            INSTR_N,
            SPLIT_K,
        )

    @gluon.jit
    def _w8a8_gluon_ws_kernel(
        a_desc,
        b_desc,
        b2_desc,
        c_desc,
        sa_ptr,
        sb_ptr,
        sb2_ptr,
        bias_ptr,
        M,
        N,
        K,
        KPS,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        PAIR: gl.constexpr,
        GROUP_M: gl.constexpr,
        NUM_STAGES: gl.constexpr,
        EPI_BUFS: gl.constexpr,
        INSTR_N: gl.constexpr,
        PINGPONG: gl.constexpr,
        SPLIT_K: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        LOADER_REGS: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        if PAIR:  # b_desc / b2_desc boxes are half a B tile each (w1 rows, then the same rows of w3)
            BLOCK_N: gl.constexpr = 2 * b_desc.block_type.shape[0]
        else:
            BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        gl.static_assert(num_warps == 4, "the default partition is consumer warpgroup 0")

        a_bufs = gl.allocate_shared_memory(gl.int8, [NUM_STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        b_bufs = gl.allocate_shared_memory(gl.int8, [NUM_STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
        if SPLIT_K > 1:  # [1, ROWS, EPI_N] boxes of the 3-D workspace descriptor over ws [S, M, N]
            ROWS: gl.constexpr = c_desc.block_type.shape[1]
            EPI_N: gl.constexpr = c_desc.block_type.shape[2]
            c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2 * EPI_BUFS, 1, ROWS, EPI_N], c_desc.layout)
        else:
            ROWS: gl.constexpr = c_desc.block_type.shape[0]
            EPI_N: gl.constexpr = c_desc.block_type.shape[1]
            c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2 * EPI_BUFS, ROWS, EPI_N], c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(ready.index(i), count=1)
            # cooperative: both consumer warpgroups read every stage; pingpong: one does
            mbarrier.init(empty.index(i), count=1 if PINGPONG else 2)
        order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(order.index(i), count=1)

        _warp_specialize(
            [
                (
                    _ws_consumer0,
                    (
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        order,
                        c_bufs,
                        c_desc,
                        sa_ptr,
                        sb_ptr,
                        sb2_ptr,
                        bias_ptr,
                        M,
                        N,
                        K,
                        KPS,
                        PINGPONG,
                        HAS_BIAS,
                        RAW_INT32,
                        SWIGLU,
                        PAIR,
                        GROUP_M,
                        INSTR_N,
                        SPLIT_K,
                    ),
                ),
                (
                    _ws_consumer1,
                    (
                        a_bufs,
                        b_bufs,
                        ready,
                        empty,
                        order,
                        c_bufs,
                        c_desc,
                        sa_ptr,
                        sb_ptr,
                        sb2_ptr,
                        bias_ptr,
                        M,
                        N,
                        K,
                        KPS,
                        PINGPONG,
                        HAS_BIAS,
                        RAW_INT32,
                        SWIGLU,
                        PAIR,
                        GROUP_M,
                        INSTR_N,
                        SPLIT_K,
                    ),
                ),
                (_ws_loader, (a_desc, b_desc, b2_desc, a_bufs, b_bufs, ready, empty, KPS, GROUP_M, SPLIT_K, PAIR)),
            ],
            [4, 1],
            [CONSUMER_REGS, LOADER_REGS],
        )


# ---------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------

_GL_DTYPE = {}
if IMPORT_ERROR is None:
    _GL_DTYPE = {
        torch.bfloat16: gl.bfloat16,
        torch.float16: gl.float16,
        torch.float32: gl.float32,
        torch.int32: gl.int32,
    }


def split_plan(cfg: GemmConfig, K: int) -> tuple[int, int]:
    """(k steps per split KPS, effective split count S) for ``cfg.split_k``: KPS = cdiv(k_tiles,
    split_k), S = cdiv(k_tiles, KPS), so every split has >= 1 k step and only the last may be
    shorter. S == 1: the unsplit kernel (no workspace)."""
    k_tiles = -(-K // cfg.block_k)
    if cfg.split_k <= 1 or k_tiles <= 1:
        return k_tiles, 1
    kps = -(-k_tiles // cfg.split_k)
    return kps, -(-k_tiles // kps)


def address_problem(cfg: GemmConfig, q, w, out, w3=None) -> str | None:
    """None when TMA can address this launch's operands (``w3``: the up weight of a gate/up pair), else why not
    (the caller then demotes)."""
    from .gemm_triton import tma_problem

    if q.shape[1] % 16:
        return f"K = {q.shape[1]} is not a multiple of 16 (TMA row alignment of the int8 operands)"
    if split_plan(cfg, q.shape[1])[1] > 1 and w.shape[0] % 4:
        return f"N = {w.shape[0]} is not a multiple of 4 (TMA rows of the int32 split-K workspace)"
    return tma_problem(q, w, out) if w3 is None else tma_problem(q, w, w3, out)


@functools.lru_cache(maxsize=256)
def _smem_layout(block: tuple, dtype):
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def build_launch(
    q, w, q_scale, w_scale, bias, out, cfg: GemmConfig, raw_int32=False, swiglu=False, ws=None, num_sms=None, up=None
):
    """(kernel, grid, args, kwargs) of one launch. Device-free: the offline compile check calls it with
    CPU tensors. swiglu: ``w`` holds gate/up rows interleaved in chunks of BLOCK_N // 2; out is [M, N // 2];
    or, with ``up = (w3, s3)``, ``w`` is the gate weight w1 [F, K] (scale ``w_scale``), w3 [F, K] the up
    weight and out [M, F] (PAIR: each stage's B tile is loaded as two half boxes, one per weight).
    Split-K (split_plan(cfg, K)[1] > 1): the kernel writes int32 partials into ``ws`` (contiguous int32
    [S, M, N]) and ignores scales, bias and ``out``; the caller reduces. Misuse raises ValueError."""
    plan = _plan(q, w, q_scale, w_scale, bias, out, cfg, raw_int32, swiglu, ws, num_sms, up)
    return _launch_args(plan, q, w, q_scale, w_scale, bias, out, ws, up)


def _plan(q, w, q_scale, w_scale, bias, out, cfg, raw_int32, swiglu, ws, num_sms, up=None) -> tuple:
    """Everything of a launch but its tensors, validated: (kernel, grid, kwargs, descriptor blocks, kps)."""
    M, K = q.shape
    N = w.shape[0]
    pair = up is not None
    why = cfg.problem(out.element_size(), swiglu) if cfg.is_gluon else f"{cfg.key()} is not a Gluon config"
    if why is None and pair and (not swiglu or tuple(up[0].shape) != (N, K) or up[0].dtype != torch.int8):
        why = f"a gate/up pair is a SwiGLU epilogue over two int8 weights of one shape [F, K] = [{N}, {K}]"
    if why is None and swiglu and (raw_int32 or bias is not None or (not pair and N % cfg.block_n)):
        why = f"the SwiGLU epilogue needs no raw_int32, no bias and N = {N} a multiple of BLOCK_N = {cfg.block_n}"
    if why is not None:
        raise ValueError(f"{cfg.key()}: {why}")
    n_out = N // 2 if swiglu and not pair else N
    if q.dtype != torch.int8 or w.dtype != torch.int8 or w.shape[1] != K or out.shape != (M, n_out):
        raise ValueError(f"q [M, K] int8, w [N, K] int8, out [M, {'N // 2' if swiglu and not pair else 'N'}]")
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
        SWIGLU=bool(swiglu),
        PAIR=pair,
        GROUP_M=cfg.group_m,
        NUM_STAGES=cfg.num_stages,
        EPI_BUFS=gluon_epi_bufs(cfg, c_bytes, swiglu),
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


def launch_gemm(
    q, w, cfg: GemmConfig, q_scale=None, w_scale=None, bias=None, out=None, raw_int32=False, swiglu=False, up=None
):
    """out = W8A8 GEMM of q [M, K] and w [N, K] (module docstring) with the Gluon config ``cfg``; returns
    ``out``. ``up = (w3, s3)``: the SwiGLU gate/up pair from two weights (``build_launch``). The caller has
    checked ``address_problem`` and that this device and Triton can run Gluon. A launch plan is kept per
    shape, strides and dtypes: a repeat call only builds the descriptors."""
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
        swiglu,
        up is not None and up[0].stride(0),
        q.device,
    )
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(q, w, q_scale, w_scale, bias, out, cfg, raw_int32, swiglu, ws, None, up)
        if len(_PLANS) > 512:
            _PLANS.clear()
        _PLANS[key] = plan
    LAST_LAUNCH["kernel"] = launch(*_launch_args(plan, q, w, q_scale, w_scale, bias, out, ws, up))
    if ws is not None:  # sum the S partial slices, then scales + bias (or the raw int32 sum)
        from .gemm_triton import reduce_partials

        reduce_partials(ws, q_scale, w_scale, bias, out, raw_int32)
    return out
