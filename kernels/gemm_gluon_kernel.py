"""The warp-specialized persistent Gluon kernel of the Hopper W8A8 GEMM (design: docs/design/gluon-gemm.md).

``_w8a8_gluon_ws_kernel`` allocates the shared-memory ring and its mbarriers and forks the TMA producer
(``_ws_loader``) and the two wgmma consumer warpgroups (``_ws_consumer0`` / ``_ws_consumer1``, cooperative or
pingpong); the device helpers they call live in gemm_gluon_device.py, the host side in gemm_gluon.py.
Defined only where Gluon imports (gluon_api.py).
"""

from __future__ import annotations

from .gluon_api import IMPORT_ERROR

if IMPORT_ERROR is None:  # Gluon code exists only where Gluon imports
    from .gemm_gluon_device import _epilogue, _store_partial, _unit, _unit_slot
    from .gluon_api import _tma_load, _warp_specialize, gl, gluon, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

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
        rows, the gate rows from w1 (b_desc) on top and the same rows of w3 (b2_desc) below."""
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
