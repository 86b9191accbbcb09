"""Gluon device helpers of the Hopper W8A8 GEMM (host side: gemm_gluon.py; design: docs/design/gluon-gemm.md).

Tile order (``_tile_coords``), split-K work units and their ring positions (``_unit``, ``_unit_slot``), TMA
staging stores (``_stage_store``, ``_store_partial``) and the dequant / bias / SwiGLU epilogue (``_epilogue``),
called by the warp-specialized kernel in gemm_gluon_kernel.py. Defined only where Gluon imports (gluon_api.py).
"""

from __future__ import annotations

from .gluon_api import IMPORT_ERROR

if IMPORT_ERROR is None:  # Gluon code exists only where Gluon imports
    from .gluon_api import _tma_store, fence_async_shared, gl, gluon, tma

    @gluon.jit
    def _tile_coords(tile_id, num_pid_in_group, num_pid_m, GROUP_M: gl.constexpr):
        # grouped order, identical to gemm_triton_kernels._tile_coords
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
        # the body of Triton's tl.sigmoid: same ops, same PTX
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
        PAIR: gl.constexpr,
        BUF0: gl.constexpr,
        NBUF: gl.constexpr,
    ):
        """acc [ROWS, BLOCK_N] -> out[off_m:, off_n:] in EPI_N-wide TMA stores through the staging
        buffers c_bufs[BUF0 : BUF0 + NBUF]. The last stores stay in flight (the caller waits
        before the buffers are reused). PAIR (the SwiGLU gate/up pair): out[off_m:, off_n:] gets
        BLOCK_N // 2 columns, silu(left half) * right half; off_n is the output column (= the gate / up
        row of w1 / w3), N = F, gate scales at sb_ptr, up scales at sb2_ptr."""
        ROWS: gl.constexpr = acc.shape[0]
        BLOCK_N: gl.constexpr = acc.shape[1]
        EPI_N: gl.constexpr = c_bufs.shape[2]
        SPLITS: gl.constexpr = BLOCK_N // EPI_N
        parts = _split_n(acc, SPLITS)
        if PAIR:
            HALF: gl.constexpr = SPLITS // 2  # subtiles per half: parts[i] gate, parts[HALF + i] up
            lay: gl.constexpr = parts[0].type.layout
            rm = off_m + gl.arange(0, ROWS, layout=gl.SliceLayout(1, lay))
            sa = gl.expand_dims(gl.load(sa_ptr + rm, mask=rm < M, other=0.0), 1)
            for i in gl.static_range(HALF):
                rg = off_n + i * EPI_N + gl.arange(0, EPI_N, layout=gl.SliceLayout(0, lay))
                sg = gl.load(sb_ptr + rg, mask=rg < N, other=0.0)
                su = gl.load(sb2_ptr + rg, mask=rg < N, other=0.0)  # up row f of w3 has its own scale vector
                col = off_n + i * EPI_N
                # gemm_triton_kernels._gate_up_epilogue, op for op in float32
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
