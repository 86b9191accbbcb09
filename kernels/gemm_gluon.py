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

Three kernels, picked by ``GluonGemmConfig.mode``:

* ``"pipelined"``: one partition of ``num_warps`` warps, persistent. The (tile, k) loop is
  flattened so TMA loads run NUM_STAGES - 1 steps ahead across tile boundaries; wgmma is async
  with one group in flight; the epilogue's TMA stores are waited for lazily.
* ``"ws"`` (cooperative, the default): warp specialized, persistent. A 1-warp producer issues
  TMA loads into a NUM_STAGES smem ring (ready/empty mbarriers); two 4-warp consumer
  warpgroups each own BLOCK_M / 2 rows of every tile, run async wgmma and their own epilogue.
  Consumers get most of the register file (setmaxnreg), the producer 40 registers.
* ``"pingpong"``: like ``"ws"`` but each consumer warpgroup owns whole tiles, alternating; one
  warpgroup's epilogue overlaps the other's main loop (the ring serializes their loads).

Split-K (``split_k`` > 1, ws / pingpong only, not with SwiGLU): the persistent loop walks
tiles x S work units, split-major (unit = split * tiles + tile); a unit covers the k steps
[s * KPS, min(k_tiles, (s + 1) * KPS)) with KPS = cdiv(k_tiles, split_k) and S = cdiv(k_tiles, KPS),
so no split is empty. Each unit TMA-stores its exact int32 partial into ws [S, M, N] through a 3-D
descriptor (box [1, rows, epi_n]; rows past M clip inside the slice), and
gemm_triton._reduce_epilogue sums the slices and applies scales + bias (or keeps the int32 sum).
With ``split_add`` the units instead TMA-reduce-add (cp.reduce.async.bulk.tensor .add.s32, done in
L2) their partials into one zeroed ws [1, M, N]: integer addition is associative, so the sum is
exact whatever order the units finish in, and the workspace traffic drops from S slices written
and read back to one.
Producer and consumers derive the same ring positions (``_unit_slot``), so the mbarrier phases
stay consistent across units of different lengths.
With ``sched_units`` (ws + split_add; SPLIT_MODE 2) each CTA instead walks its own work list, an int32
table row built on the host by splitk_schedule.py (balanced loads: every CTA about the same k steps);
KPS is then the table's row stride and the ring position a running sum of the listed units' k steps.

``wgmma_n256`` (64 x 256 per warpgroup): the compiled PTX is rewritten to one m64n256k32 per k32 step
(wgmma_n256.py) and compiled again through Triton's ``ir_override`` option.

Hopper facts the design leans on (checked on the 3.6.0 compiler, see bench/compile_gluon_sm90.py):
* The weight [N, K] is K-contiguous: its smem tile [BLOCK_N, BLOCK_K] permuted to [BLOCK_K, BLOCK_N]
  is the K-major B operand int8 wgmma needs (no transposed copy).
* Triton lowers int8 wgmma only up to n = 224, so BLOCK_N = 256 runs as m64n128k32 instructions.
* mbarrier.arrive in a partition is a partition-wide bar.sync followed by one thread's arrive:
  one arrive per consumer warpgroup, so the cooperative ring's empty barriers count 2.
"""

from __future__ import annotations

import dataclasses

import torch

from .env import sm_count
from .fast_launch import FastLauncher

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

    _IMPORT_ERROR = None
except Exception as exc:  # pragma: no cover - depends on the installed triton
    _IMPORT_ERROR = f"triton.experimental.gluon (Hopper) not importable: {exc}"

# The compiled kernel of the last launch (the probe reads its metadata / PTX).
LAST_LAUNCH: dict = {}

MODES = ("pipelined", "ws", "pingpong")
# n of the int8 wgmma instructions Triton's lowering accepts (m64nNk32), largest first.
_INT8_WGMMA_N = (224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 24, 16, 8)
_SMEM_LIMIT = 227 * 1024


@dataclasses.dataclass(frozen=True)
class GluonGemmConfig:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 128
    num_stages: int = 4
    group_m: int = 8
    mode: str = "ws"
    epi_n: int = 64  # epilogue subtile width (TMA store box); divides block_n
    num_warps: int = 8  # "pipelined" only; ws/pingpong consumers are 4-warp warpgroups
    consumer_regs: int = 232  # ws/pingpong: setmaxnreg of the consumer warpgroups
    loader_regs: int = 40  # ws/pingpong: setmaxnreg of the TMA producer warp('s warpgroup)
    split_k: int = 1  # ws/pingpong: K splits; int32 partials to a [S, M, N] workspace, then a reduce
    split_add: bool = False  # split-K: TMA reduce-add the partials into one zeroed [1, M, N] sum
    wgmma_n256: bool = False  # ws/pingpong, 64 x 256 per warpgroup: one m64n256k32 per k32 step (wgmma_n256.py)
    sched_units: int = 0  # ws split_add: balanced per-CTA work lists of ~this many units (splitk_schedule.py)

    def rows_per_consumer(self) -> int:
        if self.mode == "ws":
            return self.block_m // 2
        return self.block_m

    def smem_bytes(self, out_bytes: int = 2, epi_bufs: int | None = None, swiglu: bool = False) -> int:
        """Ring + epilogue staging + barriers. A staging buffer is one [rows, epi_n] subtile
        whatever the epilogue; SwiGLU only halves the subtiles per tile (which can change how
        many buffers alternate)."""
        ring = self.num_stages * (self.block_m + self.block_n) * self.block_k
        consumers = 1 if self.mode == "pipelined" else 2
        nbuf = _epi_bufs(self, out_bytes, swiglu) if epi_bufs is None else epi_bufs
        epi = consumers * nbuf * self.rows_per_consumer() * self.epi_n * out_bytes
        return ring + epi + 2 * self.num_stages * 8

    def key(self) -> str:
        return (
            f"gluon_{self.mode}_{self.block_m}x{self.block_n}x{self.block_k}_s{self.num_stages}"
            f"_g{self.group_m}_e{self.epi_n}" + (f"_w{self.num_warps}" if self.mode == "pipelined" else "")
            + (f"_sk{self.split_k}" + ("a" if self.split_add else "") if self.split_k > 1 else "")
            + ("_n256" if self.wgmma_n256 else "")
            + (f"_lpt{self.sched_units}" if self.sched_units else "")
        )

    @classmethod
    def from_dict(cls, d: dict) -> GluonGemmConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


DEFAULT_CONFIG = GluonGemmConfig()

# What the probe times (large Ideogram shapes: M 4096-4608, N 4608-13824, K 4608-12288).
PROBE_CONFIGS = (
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64),
    GluonGemmConfig(mode="ws", num_stages=3, epi_n=128),
    GluonGemmConfig(mode="ws", block_m=256, block_n=128, num_stages=3, epi_n=64),
    GluonGemmConfig(mode="pingpong", block_m=128, block_n=128, num_stages=5, epi_n=64),
    GluonGemmConfig(mode="pingpong", block_m=64, block_n=256, num_stages=4, epi_n=64),
    GluonGemmConfig(mode="pipelined", num_stages=3, epi_n=64),
    GluonGemmConfig(mode="pipelined", num_stages=4, epi_n=64),
    GluonGemmConfig(mode="pipelined", block_m=128, block_n=128, num_stages=5, num_warps=4, epi_n=64),
)

# Split-K (ws / pingpong): the long-K, few-tile llm_cond_proj (M ~ 512, N 4608, K 53248). 128x256
# tiles: 72 x 11 splits = 792 units = 6 waves of 132 SMs; 128x128: 144 x 11 = 1584 = 12 waves.
SPLITK_PROBE_CONFIGS = (
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64, split_k=11),
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64, split_k=6),
    GluonGemmConfig(mode="pingpong", block_m=128, block_n=128, num_stages=5, epi_n=64, split_k=11),
    GluonGemmConfig(mode="pingpong", block_m=128, block_n=128, num_stages=5, epi_n=64, split_k=4),
    GluonGemmConfig(mode="ws", block_m=128, block_n=128, num_stages=5, epi_n=64, split_k=11),
    # fewer splits, less workspace traffic (S x M x N x 4 B written and read back): 72 x 5 = 360
    # units = 2.7 per SM, 72 x 9 = 648 = 4.9 per SM; 144 x 7 = 1008 = 7.6 per SM
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64, split_k=5),
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64, split_k=9),
    GluonGemmConfig(mode="pingpong", block_m=128, block_n=128, num_stages=5, epi_n=64, split_k=7),
    # the partials TMA-reduce-added into one [1, M, N] sum (L2) instead of S slices
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64, split_k=5, split_add=True),
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64, split_k=6, split_add=True),
    GluonGemmConfig(mode="ws", num_stages=4, epi_n=64, split_k=11, split_add=True),
    GluonGemmConfig(mode="pingpong", block_m=128, block_n=128, num_stages=5, epi_n=64, split_k=11, split_add=True),
)


def _epi_bufs(cfg, out_bytes: int = 2, swiglu: bool = False) -> int:
    """Epilogue staging buffers per consumer: two alternate (store_wait(1) frees the older) when
    the subtile count per tile is even and they fit; else one (int32 output of a deep ring, say).
    SwiGLU stores BLOCK_N // 2 columns per tile: half the subtiles."""
    subtiles = cfg.block_n // (2 if swiglu else 1) // cfg.epi_n
    if subtiles % 2 or cfg.smem_bytes(out_bytes, epi_bufs=2) > _SMEM_LIMIT:
        return 1
    return 2


def validate_swiglu(cfg: GluonGemmConfig) -> str | None:
    """None when ``cfg`` can run the SwiGLU epilogue (on top of ``validate``), else why not."""
    if (cfg.block_n // 2) % cfg.epi_n:
        return "SwiGLU: epi_n must divide block_n // 2 (a subtile may not straddle gate and up)"
    return None


def _mma_shape(rows: int, block_n: int, num_warps: int) -> tuple[int, int]:
    """(warps along M, wgmma n) for an accumulator [rows, block_n] over num_warps warps."""
    wm, wn = 4, 1
    while wm * wn < num_warps:
        if rows > 16 * wm:
            wm *= 2
        else:
            wn *= 2
    per_warp_n = block_n // wn
    for n in _INT8_WGMMA_N:
        if n <= per_warp_n and per_warp_n % n == 0:
            return wm, n
    raise ValueError(f"no int8 wgmma shape for {rows}x{block_n} on {num_warps} warps")


def validate(cfg: GluonGemmConfig) -> str | None:
    """None when the config can compile, otherwise why not."""
    if cfg.mode not in MODES:
        return f"mode must be one of {MODES}"
    rows = cfg.rows_per_consumer()
    warps = cfg.num_warps if cfg.mode == "pipelined" else 4
    if rows % 64 or rows < 64 or warps % 4:
        return "wgmma needs >= 64 rows per warpgroup (multiple of 64) and whole warpgroups"
    if rows < 16 * warps and cfg.mode == "pipelined" and (cfg.block_n // (warps * 16 // rows)) < 8:
        return "tile too small for the warp count"
    if cfg.block_k % 32 or cfg.block_k > 128 or cfg.block_n % cfg.epi_n or cfg.epi_n < 16:
        return "block_k must be 32..128 (multiple of 32); epi_n must divide block_n"
    if cfg.num_stages < 2:
        return "num_stages >= 2"
    if cfg.split_k < 1 or (cfg.split_k > 1 and cfg.mode == "pipelined"):
        return "split_k >= 1; split_k > 1 runs in the ws / pingpong kernels only"
    if cfg.split_add and cfg.split_k <= 1:
        return "split_add needs split_k > 1"
    if cfg.sched_units and (cfg.mode != "ws" or not cfg.split_add or cfg.sched_units < 1):
        return "sched_units (scheduled split-K) needs the cooperative ws kernel with split_add"
    if cfg.mode != "pipelined" and (cfg.consumer_regs % 8 or cfg.loader_regs % 8):
        return "setmaxnreg counts are multiples of 8"
    try:
        _, instr_n = _mma_shape(rows, cfg.block_n, warps)
    except ValueError as exc:
        return str(exc)
    if cfg.wgmma_n256 and (cfg.mode == "pipelined" or rows != 64 or cfg.block_n != 256 or instr_n != 128):
        return "wgmma_n256 needs ws/pingpong with a 64 x 256 accumulator per warpgroup"
    if cfg.smem_bytes(4) > _SMEM_LIMIT:  # int32 (RAW_INT32) staging with one buffer must fit too
        return f"shared memory {cfg.smem_bytes(4)} B > {_SMEM_LIMIT} B"
    return None


def gluon_available(device) -> str | None:
    """None when the Gluon kernel can run on ``device``, otherwise the reason it cannot."""
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"needs sm_90 (Hopper), device is sm_{cap[0]}{cap[1]}"
    return None


# ---------------------------------------------------------------------------------------------
# device code
# ---------------------------------------------------------------------------------------------

if _IMPORT_ERROR is None:
    from triton._C.libtriton import ir as _ir
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """global[coord box] += smem ``src`` (cp.reduce.async.bulk.tensor .add), completed like a
        TMA store (tma.store_wait). Triton 3.6 builds the op but Gluon exports no wrapper."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)

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
    def _unit_count(sched_ptr, pid, nprog, tiles, KPS, SPLIT_K: gl.constexpr, SPLIT_MODE: gl.constexpr):
        """Work units of this CTA: its work list's length (SPLIT_MODE 2, KPS = the list's row stride),
        else every nprog-th of the tiles x splits units."""
        if SPLIT_MODE == 2:
            n = gl.load(sched_ptr + pid * KPS)
        else:
            n = gl.cdiv(tiles * SPLIT_K - pid, nprog)
        return n

    @gluon.jit
    def _listed_unit(sched_ptr, pid, j, KPS):
        """The j-th unit of this CTA's work list (splitk_schedule.table): (pid_m, pid_n, 0, k0, k steps)."""
        row = sched_ptr + pid * KPS + 1 + 4 * j
        return gl.load(row), gl.load(row + 1), 0, gl.load(row + 2), gl.load(row + 3)

    @gluon.jit
    def _stage_store(val, desc, coord, buf, NBUF: gl.constexpr, REDUCE_ADD: gl.constexpr = False):
        """val -> smem staging ``buf`` -> global at ``coord`` through ``desc`` (TMA store, or
        reduce-add). Waits first until the store that last used ``buf`` has read it (NBUF buffers
        alternate); this store stays in flight."""
        tma.store_wait(NBUF - 1)
        buf.reshape(val.shape).store(val)  # a [1, R, C] box of the 3-D workspace takes [R, C]
        fence_async_shared()
        if REDUCE_ADD:
            _tma_reduce_add(desc, coord, buf)
        else:
            tma.async_copy_shared_to_global(desc, coord, buf)

    @gluon.jit
    def _store_partial(
        acc, c_desc, c_bufs, split, off_m, off_n, BUF0: gl.constexpr, NBUF: gl.constexpr, MODE: gl.constexpr
    ):
        """Split-K: the int32 partial acc [ROWS, BLOCK_N] -> ws[split, off_m:, off_n:] through a
        3-D TMA descriptor over ws [S, M, N] (box [1, ROWS, EPI_N]): rows past M are clipped at
        M, never written into the next slice. MODE 1 / 2: reduce-added into ws[0] instead."""
        BLOCK_N: gl.constexpr = acc.shape[1]
        EPI_N: gl.constexpr = c_bufs.shape[3]
        SPLITS: gl.constexpr = BLOCK_N // EPI_N
        parts = _split_n(acc, SPLITS)
        for i in gl.static_range(SPLITS):
            coord = [0 if MODE >= 1 else split, off_m, off_n + i * EPI_N]
            _stage_store(parts[i], c_desc, coord, c_bufs.index(BUF0 + i % NBUF), NBUF, MODE >= 1)

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
        bias_ptr,
        off_m,
        off_n,
        M,
        N,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        BUF0: gl.constexpr,
        NBUF: gl.constexpr,
    ):
        """acc [ROWS, BLOCK_N] -> out[off_m:, off_n:] in EPI_N-wide TMA stores through the staging
        buffers c_bufs[BUF0 : BUF0 + NBUF]. The last stores stay in flight (the caller waits
        before the buffers are reused). SWIGLU: out[off_m:, off_n // 2:] gets BLOCK_N // 2
        columns, silu(left half) * right half."""
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
                ru = rg + BLOCK_N // 2
                sg = gl.load(sb_ptr + rg, mask=rg < N, other=0.0)
                su = gl.load(sb_ptr + ru, mask=ru < N, other=0.0)
                # _dequant_tile, then _swiglu_tile of gemm_triton, op for op in float32
                g = parts[i].to(gl.float32) * sa
                g = g * gl.expand_dims(sg, 0)
                u = parts[HALF + i].to(gl.float32) * sa
                u = u * gl.expand_dims(su, 0)
                h = (g * _sigmoid(g) * u).to(c_desc.dtype)
                _stage_store(h, c_desc, [off_m, off_n // 2 + i * EPI_N], c_bufs.index(BUF0 + i % NBUF), NBUF)
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

    # -- "pipelined": one partition, software pipelined -----------------------------------------

    @gluon.jit
    def _w8a8_gluon_pipelined_kernel(
        a_desc,
        b_desc,
        c_desc,
        sa_ptr,
        sb_ptr,
        bias_ptr,
        M,
        N,
        K,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        GROUP_M: gl.constexpr,
        NUM_STAGES: gl.constexpr,
        EPI_BUFS: gl.constexpr,
        WARPS_M: gl.constexpr,
        INSTR_N: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        EPI_N: gl.constexpr = c_desc.block_type.shape[1]
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[WARPS_M, num_warps // WARPS_M], instr_shape=[16, INSTR_N, 32]
        )

        a_bufs = gl.allocate_shared_memory(gl.int8, [NUM_STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
        b_bufs = gl.allocate_shared_memory(gl.int8, [NUM_STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
        c_bufs = gl.allocate_shared_memory(c_desc.dtype, [EPI_BUFS, BLOCK_M, EPI_N], c_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(ready.index(i), count=1)

        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_pid_in_group = GROUP_M * num_pid_n
        k_tiles = gl.cdiv(K, BLOCK_K)
        my_tiles = gl.cdiv(num_pid_m * num_pid_n - pid, nprog)
        total = my_tiles * k_tiles
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes

        # prologue: the first NUM_STAGES - 1 steps of the flattened (tile, k) loop
        for p in gl.static_range(NUM_STAGES - 1):
            pm, pn = _tile_coords(pid + (p // k_tiles) * nprog, num_pid_in_group, num_pid_m, GROUP_M)
            kk = p % k_tiles
            bar = ready.index(p)
            ok = p < total
            mbarrier.expect(bar, nbytes, pred=ok)
            tma.async_copy_global_to_shared(a_desc, [pm * BLOCK_M, kk * BLOCK_K], bar, a_bufs.index(p), ok)
            tma.async_copy_global_to_shared(b_desc, [pn * BLOCK_N, kk * BLOCK_K], bar, b_bufs.index(p), ok)

        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, acc_layout)
        for it in range(total):
            s = it % NUM_STAGES
            kk = it % k_tiles
            mbarrier.wait(ready.index(s), (it // NUM_STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, use_acc=kk > 0, is_async=True)
            # step it - 1 has retired: its slot, (it + NUM_STAGES - 1) % NUM_STAGES, is refilled
            acc = warpgroup_mma_wait(1, deps=(acc,))
            nxt = it + NUM_STAGES - 1
            ns = nxt % NUM_STAGES
            pm, pn = _tile_coords(pid + (nxt // k_tiles) * nprog, num_pid_in_group, num_pid_m, GROUP_M)
            ok = nxt < total
            bar = ready.index(ns)
            mbarrier.expect(bar, nbytes, pred=ok)
            tma.async_copy_global_to_shared(
                a_desc, [pm * BLOCK_M, (nxt % k_tiles) * BLOCK_K], bar, a_bufs.index(ns), ok
            )
            tma.async_copy_global_to_shared(
                b_desc, [pn * BLOCK_N, (nxt % k_tiles) * BLOCK_K], bar, b_bufs.index(ns), ok
            )
            if kk == k_tiles - 1:
                acc = warpgroup_mma_wait(0, deps=(acc,))
                pid_m, pid_n = _tile_coords(pid + (it // k_tiles) * nprog, num_pid_in_group, num_pid_m, GROUP_M)
                _epilogue(
                    acc, c_desc, c_bufs, sa_ptr, sb_ptr, bias_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N,
                    HAS_BIAS, RAW_INT32, SWIGLU, 0, EPI_BUFS,
                )  # fmt: skip
        tma.store_wait(0)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.invalidate(ready.index(i))

    # -- "ws" / "pingpong": warp specialized ----------------------------------------------------

    @gluon.jit
    def _ws_loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, KPS, sched_ptr, GROUP_M: gl.constexpr,
                   SPLIT_K: gl.constexpr, SPLIT_MODE: gl.constexpr):  # fmt: skip
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
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
        my_units = _unit_count(sched_ptr, pid, nprog, tiles, KPS, SPLIT_K, SPLIT_MODE)
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
        slot = 0
        for j in range(my_units):
            if SPLIT_MODE == 2:
                pid_m, pid_n, split, k0, nk = _listed_unit(sched_ptr, pid, j, KPS)
            else:
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
                tma.async_copy_global_to_shared(a_desc, [off_m, kk * BLOCK_K], bar, a_bufs.index(s))
                tma.async_copy_global_to_shared(b_desc, [off_n, kk * BLOCK_K], bar, b_bufs.index(s))
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
        bias_ptr,
        M,
        N,
        K,
        KPS,
        sched_ptr,
        WG: gl.constexpr,
        PINGPONG: gl.constexpr,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        GROUP_M: gl.constexpr,
        INSTR_N: gl.constexpr,
        SPLIT_K: gl.constexpr,
        SPLIT_MODE: gl.constexpr,
    ):
        NUM_STAGES: gl.constexpr = a_bufs.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.shape[2]
        BLOCK_N: gl.constexpr = b_bufs.shape[1]
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
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_pid_in_group = GROUP_M * num_pid_n
        k_tiles = gl.cdiv(K, BLOCK_K)
        tiles = num_pid_m * num_pid_n
        my_tiles = _unit_count(sched_ptr, pid, nprog, tiles, KPS, SPLIT_K, SPLIT_MODE)  # work units
        # pingpong: warpgroup WG takes local tiles WG, WG + 2, ...; cooperative: rows WG * ROWS + [0, ROWS)
        first: gl.constexpr = WG if PINGPONG else 0
        step: gl.constexpr = 2 if PINGPONG else 1
        row0: gl.constexpr = 0 if PINGPONG else WG * ROWS

        acc = gl.zeros([ROWS, BLOCK_N], gl.int32, acc_layout)
        n = 0  # tiles this warpgroup has done
        slot = 0  # ring position of the next k step (the loader's order)
        for j in range(first, my_tiles, step):
            if SPLIT_MODE == 2:  # cooperative only: both warpgroups run every listed unit, slot runs on
                pid_m, pid_n, split, k0, nk = _listed_unit(sched_ptr, pid, j, KPS)
            else:
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
                _store_partial(acc, c_desc, c_bufs, split, pid_m * BLOCK_M + row0, pid_n * BLOCK_N,
                               WG * EPI_BUFS, EPI_BUFS, SPLIT_MODE)  # fmt: skip
            else:
                _epilogue(
                    acc, c_desc, c_bufs, sa_ptr, sb_ptr, bias_ptr, pid_m * BLOCK_M + row0, pid_n * BLOCK_N, M, N,
                    HAS_BIAS, RAW_INT32, SWIGLU, WG * EPI_BUFS, EPI_BUFS,
                )  # fmt: skip
            n += 1
        tma.store_wait(0)

    # Partition entry points: the warpgroup index reaches _ws_consumer as a literal constexpr
    # (worker partition arguments are passed through IR block arguments).
    @gluon.jit
    def _ws_consumer0(a_bufs, b_bufs, ready, empty, order, c_bufs, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                      KPS, sched_ptr, PINGPONG: gl.constexpr, HAS_BIAS: gl.constexpr, RAW_INT32: gl.constexpr,
                      SWIGLU: gl.constexpr, GROUP_M: gl.constexpr, INSTR_N: gl.constexpr,
                      SPLIT_K: gl.constexpr, SPLIT_MODE: gl.constexpr):  # fmt: skip
        _ws_consumer(a_bufs, b_bufs, ready, empty, order, c_bufs, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                     KPS, sched_ptr, 0, PINGPONG, HAS_BIAS, RAW_INT32, SWIGLU, GROUP_M, INSTR_N, SPLIT_K,
                     SPLIT_MODE)  # fmt: skip

    @gluon.jit
    def _ws_consumer1(a_bufs, b_bufs, ready, empty, order, c_bufs, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                      KPS, sched_ptr, PINGPONG: gl.constexpr, HAS_BIAS: gl.constexpr, RAW_INT32: gl.constexpr,
                      SWIGLU: gl.constexpr, GROUP_M: gl.constexpr, INSTR_N: gl.constexpr,
                      SPLIT_K: gl.constexpr, SPLIT_MODE: gl.constexpr):  # fmt: skip
        _ws_consumer(a_bufs, b_bufs, ready, empty, order, c_bufs, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                     KPS, sched_ptr, 1, PINGPONG, HAS_BIAS, RAW_INT32, SWIGLU, GROUP_M, INSTR_N, SPLIT_K,
                     SPLIT_MODE)  # fmt: skip

    @gluon.jit
    def _w8a8_gluon_ws_kernel(
        a_desc,
        b_desc,
        c_desc,
        sa_ptr,
        sb_ptr,
        bias_ptr,
        M,
        N,
        K,
        KPS,
        sched_ptr,
        HAS_BIAS: gl.constexpr,
        RAW_INT32: gl.constexpr,
        SWIGLU: gl.constexpr,
        GROUP_M: gl.constexpr,
        NUM_STAGES: gl.constexpr,
        EPI_BUFS: gl.constexpr,
        INSTR_N: gl.constexpr,
        PINGPONG: gl.constexpr,
        SPLIT_K: gl.constexpr,
        SPLIT_MODE: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        LOADER_REGS: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
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

        gl.warp_specialize(
            [
                (
                    _ws_consumer0,
                    (a_bufs, b_bufs, ready, empty, order, c_bufs, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                     KPS, sched_ptr, PINGPONG, HAS_BIAS, RAW_INT32, SWIGLU, GROUP_M, INSTR_N, SPLIT_K, SPLIT_MODE),
                ),
                (
                    _ws_consumer1,
                    (a_bufs, b_bufs, ready, empty, order, c_bufs, c_desc, sa_ptr, sb_ptr, bias_ptr, M, N, K,
                     KPS, sched_ptr, PINGPONG, HAS_BIAS, RAW_INT32, SWIGLU, GROUP_M, INSTR_N, SPLIT_K, SPLIT_MODE),
                ),
                (_ws_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, KPS, sched_ptr, GROUP_M, SPLIT_K,
                              SPLIT_MODE)),
            ],
            [4, 1],
            [CONSUMER_REGS, LOADER_REGS],
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------

_GL_DTYPE = {}
if _IMPORT_ERROR is None:
    _GL_DTYPE = {
        torch.bfloat16: gl.bfloat16,
        torch.float16: gl.float16,
        torch.float32: gl.float32,
        torch.int32: gl.int32,
    }


def tma_ok(q, w, out) -> bool:
    """TMA: 16-byte aligned bases and row strides, unit inner stride (asked on every launch: a plain loop)."""
    for t in (q, w, out):
        if t.dim() != 2 or t.stride(1) != 1 or t.data_ptr() & 15 or (t.stride(0) * t.element_size()) & 15:
            return False
    return True


def split_plan(cfg, K: int) -> tuple[int, int]:
    """(k steps per split KPS, effective split count S) for ``cfg.split_k``: KPS = cdiv(k_tiles,
    split_k), S = cdiv(k_tiles, KPS), so every split has >= 1 k step and only the last may be
    shorter. S == 1: the unsplit kernel (no workspace)."""
    k_tiles = -(-K // cfg.block_k)
    if cfg.split_k <= 1 or k_tiles <= 1:
        return k_tiles, 1
    kps = -(-k_tiles // cfg.split_k)
    return kps, -(-k_tiles // kps)


def workspace_shape(cfg, M: int, N: int, K: int) -> tuple[int, int, int] | None:
    """The int32 split-K workspace a launch of ``cfg`` uses: [S, M, N], or [1, M, N] (zeroed
    before the launch) for ``split_add``; None when K is not split."""
    splits = split_plan(cfg, K)[1]
    if splits <= 1:
        return None
    return (1, M, N) if cfg.split_add else (splits, M, N)


def _check_swiglu(cfg, w, bias, raw_int32) -> None:
    why = validate_swiglu(cfg)
    if cfg.split_k > 1:
        raise ValueError(f"{cfg}: the SwiGLU epilogue cannot run split-K")
    if raw_int32 or bias is not None or w.shape[0] % cfg.block_n or why is not None:
        raise ValueError(
            f"{cfg}: the SwiGLU epilogue needs no raw_int32, no bias, N = {w.shape[0]} a multiple of "
            f"BLOCK_N = {cfg.block_n}" + (f"; {why}" if why else "")
        )


def build_launch(q, w, q_scale, w_scale, bias, out, raw_int32=False, cfg=None, num_sms=None, swiglu=False, ws=None):
    """(kernel, grid, args, kwargs) of one launch, or None when TMA alignment rules it out.
    Device-free: the offline compile check (bench/compile_gluon_sm90.py) calls it with CPU tensors.
    swiglu: ``w`` holds gate/up rows interleaved in chunks of BLOCK_N // 2; out is [M, N // 2].
    Split-K (workspace_shape(cfg, M, N, K) not None): the kernel writes int32 partials into ``ws``
    (that shape, contiguous int32) and ignores scales, bias and ``out``; the caller reduces."""
    cfg = cfg or DEFAULT_CONFIG
    if isinstance(cfg, dict):
        cfg = GluonGemmConfig.from_dict(cfg)
    why = validate(cfg)
    if why is not None:
        raise ValueError(f"{cfg}: {why}")
    M, K = q.shape
    N = w.shape[0]
    if swiglu:
        _check_swiglu(cfg, w, bias, raw_int32)
    n_out = N // 2 if swiglu else N
    if q.dtype != torch.int8 or w.dtype != torch.int8 or w.shape[1] != K or out.shape != (M, n_out):
        raise ValueError(f"q [M, K] int8, w [N, K] int8, out [M, {'N // 2' if swiglu else 'N'}]")
    if raw_int32 != (out.dtype == torch.int32) or out.dtype not in _GL_DTYPE:
        raise ValueError("raw_int32 needs an int32 out; otherwise out is bf16/fp16/fp32")
    kps, splits = split_plan(cfg, K)
    ws_shape = workspace_shape(cfg, M, N, K)
    if splits > 1 and (ws is None or tuple(ws.shape) != ws_shape or ws.dtype != torch.int32
                       or not ws.is_contiguous()):  # fmt: skip
        raise ValueError(f"{cfg}: split-K needs a contiguous int32 workspace ws {list(ws_shape)}")
    if K % 16 or not tma_ok(q, w, out) or (splits > 1 and (N % 4 or ws.data_ptr() & 15)):
        return None
    if cfg.smem_bytes(out.element_size(), swiglu=swiglu) > _SMEM_LIMIT:
        raise ValueError(f"{cfg}: shared memory over the limit for {out.dtype}")
    rows = cfg.rows_per_consumer()
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_desc = TensorDescriptor.from_tensor(q, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], gl.int8))
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], gl.int8))
    if splits > 1:
        # 3-D over ws [S, M, N], box [1, rows, epi_n]: TMA clips a tile's rows at M inside its slice
        box = [1, rows, cfg.epi_n]
        c_desc = TensorDescriptor.from_tensor(ws, box, gl.NVMMASharedLayout.get_default_for(box, gl.int32))
        q_scale = w_scale = bias = None
        raw_int32, c_bytes = True, 4
    else:
        c_ty = _GL_DTYPE[out.dtype]
        c_desc = TensorDescriptor.from_tensor(
            out, [rows, cfg.epi_n], gl.NVMMASharedLayout.get_default_for([rows, cfg.epi_n], c_ty)
        )
        c_bytes = out.element_size()
    units = -(-M // bm) * -(-N // bn) * splits
    grid = (max(1, min(num_sms or sm_count(q.device), units)),)
    split_mode = int(bool(cfg.split_add) and splits > 1)  # 0: one slice per split, 1: reduce-add
    sched = _dummy_i32(q.device)
    if splits > 1 and cfg.sched_units:  # 2: reduce-add, each CTA walking its own balanced work list
        ctas = num_sms or sm_count(q.device)
        sched, kps = _work_lists(-(-M // bm), -(-N // bn), -(-K // bk), ctas, cfg.sched_units, q.device)
        grid, split_mode = (ctas,), 2
    dummy = w_scale if w_scale is not None else (ws if splits > 1 else out)
    args = (
        a_desc,
        b_desc,
        c_desc,
        q_scale if q_scale is not None else dummy,
        dummy,
        bias if bias is not None else dummy,
        M,
        N,
        K,
    )
    common = dict(
        HAS_BIAS=bias is not None,
        RAW_INT32=raw_int32,
        SWIGLU=bool(swiglu),
        GROUP_M=cfg.group_m,
        NUM_STAGES=cfg.num_stages,
        EPI_BUFS=_epi_bufs(cfg, c_bytes, swiglu),
    )
    if cfg.mode == "pipelined":
        wm, instr_n = _mma_shape(bm, bn, cfg.num_warps)
        kwargs = dict(common, WARPS_M=wm, INSTR_N=instr_n, num_warps=cfg.num_warps)
        return _w8a8_gluon_pipelined_kernel, grid, args, kwargs
    _, instr_n = _mma_shape(rows, bn, 4)
    # 4 + 4 + 1 warps round up to 3 warpgroups: the launch register cap must fit 12 warps
    # (65536 / (12 * 32) = 170 -> 168); setmaxnreg then moves the loader's share to the consumers.
    args = args + (kps, sched)
    kwargs = dict(
        common,
        INSTR_N=instr_n,
        PINGPONG=cfg.mode == "pingpong",
        SPLIT_K=splits,
        SPLIT_MODE=split_mode,
        CONSUMER_REGS=cfg.consumer_regs,
        LOADER_REGS=cfg.loader_regs,
        num_warps=4,
        maxnreg=168,
    )
    return _w8a8_gluon_ws_kernel, grid, args, kwargs


def launch_gemm_gluon(q, w, q_scale, w_scale, bias, out, raw_int32=False, cfg=None, swiglu=False):
    """out = W8A8 GEMM of q [M, K] and w [N, K] (see module docstring); returns ``out``, or None
    when TMA cannot address the operands (K % 16, alignment): the caller then falls back.
    swiglu=True: out [M, N // 2] = silu(gate) * up of the interleaved w (module docstring)."""
    cfg = cfg or DEFAULT_CONFIG
    if swiglu:
        _check_swiglu(cfg, w, bias, raw_int32)  # before the TMA test: misuse raises, never falls back
    if not tma_ok(q, w, out):
        return None
    # cfg (a frozen dataclass) carries split_k; the shapes fix the workspace and its descriptor
    key = (cfg, q.shape, w.shape[0], q.stride(0), w.stride(0), out.stride(0), out.dtype, raw_int32,
           q_scale is None, w_scale is None, bias is None, q.device, swiglu)  # fmt: skip
    plan = _PLANS.get(key)
    ws_shape = workspace_shape(cfg, q.shape[0], w.shape[0], q.shape[1]) if cfg.split_k > 1 else None
    ws = None
    if ws_shape:  # split_add sums into ws[0] in place: it starts from zero
        ws = (torch.zeros if cfg.split_add else torch.empty)(ws_shape, dtype=torch.int32, device=q.device)
    if plan is None:
        why = gluon_available(q.device)
        if why is not None:
            raise RuntimeError(why)
        launch = build_launch(q, w, q_scale, w_scale, bias, out, raw_int32=raw_int32, cfg=cfg, swiglu=swiglu, ws=ws)
        if launch is None:
            return None
        kernel, grid, args, kwargs = launch
        if cfg.wgmma_n256:
            kwargs = with_n256_override(kernel, grid, args, kwargs, cfg)
        LAST_LAUNCH["kernel"] = _LAUNCHERS[kernel](grid, *args, **kwargs)
        if len(_PLANS) > 512:
            _PLANS.clear()
        _PLANS[key] = (_LAUNCHERS[kernel], grid, kwargs, [_desc_fields(d) for d in args[:3]], args[9:])
    else:
        # Same shapes, strides, dtypes and config as a launch already built: only the tensors differ.
        # (Building the launch re-validates the config and re-derives three smem layouts and
        # descriptors: ~50 us of host time on a fast CPU, more than a short GEMM's GPU time.)
        launcher, grid, kwargs, fields, extra = plan
        if ws is not None:
            args = (_desc(fields[0], q), _desc(fields[1], w), _desc(fields[2], ws), ws, ws, ws)
        else:
            dummy = w_scale if w_scale is not None else out
            args = (
                _desc(fields[0], q), _desc(fields[1], w), _desc(fields[2], out),
                q_scale if q_scale is not None else dummy, dummy, bias if bias is not None else dummy,
            )  # fmt: skip
        LAST_LAUNCH["kernel"] = launcher(grid, *args, q.shape[0], w.shape[0], q.shape[1], *extra, **kwargs)
    if ws is not None:  # sum the S partial slices, then scales + bias (or the raw int32 sum)
        from .gemm_triton import _reduce_epilogue

        _reduce_epilogue(ws, q_scale, w_scale, bias, out, raw_int32)
    return out


_PLANS: dict = {}
_DUMMIES: dict = {}
_WORK_LISTS: dict = {}


def _dummy_i32(device):
    """A placeholder for the work-list pointer of launches without one (never read)."""
    if device not in _DUMMIES:
        _DUMMIES[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _DUMMIES[device]


def _work_lists(num_pid_m, num_pid_n, k_tiles, ctas, units_per_cta, device):
    """(int32 [ctas, 1 + 4 U] work-list table on ``device``, its row stride), built once per shape:
    the launch plan keeps the tensor, so CUDA-graph replays read the same memory."""
    from . import splitk_schedule as S

    key = (num_pid_m, num_pid_n, k_tiles, ctas, units_per_cta, device)
    if key not in _WORK_LISTS:
        rows, u = S.build(num_pid_m, num_pid_n, k_tiles, ctas, units_per_cta)
        S.check_cover(rows, num_pid_m, num_pid_n, k_tiles)
        _WORK_LISTS[key] = torch.tensor(S.table(rows, u), dtype=torch.int32, device=device)
    t = _WORK_LISTS[key]
    return t, t.shape[1]
# config key -> why its n = 256 rewrite was not applied (the kernel then runs as Triton compiled it)
N256_FALLBACKS: dict = {}


def with_n256_override(kernel, grid, args, kwargs, cfg) -> dict:
    """``kwargs`` plus Triton's ``ir_override`` option naming the PTX with merged n = 256 wgmma
    (wgmma_n256.py) of this launch's kernel, compiled once without launching to read its PTX. When
    the PTX does not match the rewrite's pattern: ``kwargs`` unchanged, the reason in N256_FALLBACKS."""
    from . import wgmma_n256

    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    try:
        path = wgmma_n256.override_path(compiled.asm["ptx"], wgmma_n256.default_cache_dir(), row_bytes=cfg.block_k)
    except wgmma_n256.MergeError as exc:
        N256_FALLBACKS[cfg.key()] = str(exc)
        return kwargs
    N256_FALLBACKS.pop(cfg.key(), None)
    return dict(kwargs, ir_override=path)


def _desc_fields(desc) -> dict:
    return {k: v for k, v in vars(desc).items() if k != "base"}


def _desc(fields: dict, base):
    """A host TensorDescriptor for ``base`` with the fields of one built for an identically shaped,
    strided and typed tensor (skips the dataclass's re-validation, which dominates its cost)."""
    d = object.__new__(TensorDescriptor)
    d.__dict__.update(fields)
    d.base = base
    return d


_LAUNCHERS = {}
if _IMPORT_ERROR is None:
    _LAUNCHERS = {k: FastLauncher(k) for k in (_w8a8_gluon_pipelined_kernel, _w8a8_gluon_ws_kernel)}
