"""GEMM tile configurations: one config class, the per-architecture search spaces, a heuristic.

A ``GemmConfig`` names the kernel that runs it and its tile; ``key()`` is its one string form
(registry, panel, tuning table, autotune cache). Kernels:

* ``triton``: the portable pointer-based Triton kernel (sm_80+), split-K capable;
* ``triton-tma``: the portable persistent kernel with TMA descriptors (sm_90);
* ``gluon-ws`` / ``gluon-pingpong``: the Hopper Gluon kernels (gemm_gluon.py), cooperative or
  ping-pong warp specialization; split-K writes int32 partial slices that one kernel reduces.

Search spaces (what autotuning may try), by architecture family:

* ``sm90`` (H100/H200, 227 KB smem/block): measured. Large tiles keep BLOCK_M % 64 == 0,
  num_warps % 4 == 0 and BLOCK_K >= 32 so Triton emits int8 wgmma.
* ``sm80`` (A100, 163 KB): reasoned, not measured here (no Ampere GPU at hand).
* ``sm86`` / ``sm89`` (RTX 30xx/A40, RTX 40xx/L40, ~99 KB smem/block): reasoned, not measured.
* ``sm100`` (B200/B300, 227 KB smem/block, tcgen05 tensor cores): Hopper's portable space (Triton emits tcgen05
  int8 MMA from 3.8, mma.sync before) but for the persistent TMA kernel's 128x256 / 256x128 tiles, whose int32
  output needs 272 KB under Triton 3.8's tcgen05 lowering (offline compile); reasoned, not measured.
* ``sm120`` (RTX 50, GB10: ~99 KB smem/block, mma.sync int8/fp8 tensor cores, no wgmma): Ada's space; reasoned,
  not measured.
Small-M tiles (BLOCK_M 16/32) compile to mma.sync everywhere; they serve M <= 64. On a family this repository has
not measured, the kernels check themselves against their twins before first use (self_check.py).

Nothing here imports Triton: the offline compile check and the tuning table use it on any machine.
"""

from __future__ import annotations

import dataclasses

KERNELS = ("triton", "triton-tma", "gluon-ws", "gluon-pingpong")
# which backend runs a kernel (backends.py): the ladder demotes gluon -> triton -> cuBLAS int8
BACKEND_OF = {"triton": "triton", "triton-tma": "triton", "gluon-ws": "gluon", "gluon-pingpong": "gluon"}

GLUON_SMEM_LIMIT = 227 * 1024
GLUON_CONSUMER_REGS = 232  # setmaxnreg of the two consumer warpgroups
GLUON_LOADER_REGS = 40  # setmaxnreg of the TMA producer warp's warpgroup
# n of the int8 wgmma instructions Triton's lowering accepts (m64nNk32), largest first
_INT8_WGMMA_N = (224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 24, 16, 8)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    kernel: str = "triton"
    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8  # grouped tile order: GROUP_M row tiles share each weight panel in L2
    num_warps: int = 4  # gluon: the consumer warpgroup's 4
    num_stages: int = 3
    split_k: int = 1  # K splits; exact int32 partials summed by a reduce kernel
    subtile: bool = False  # triton-tma: the epilogue stored as two half-width tiles
    epi_n: int = 64  # gluon: epilogue subtile width (TMA store box)

    @property
    def backend(self) -> str:
        return BACKEND_OF.get(self.kernel, "unknown")

    @property
    def is_gluon(self) -> bool:
        return self.backend == "gluon"

    def key(self) -> str:
        key = f"{self.kernel}/{self.block_m}x{self.block_n}x{self.block_k}/g{self.group_m}/w{self.num_warps}"
        key += f"/s{self.num_stages}"
        if self.split_k > 1:
            key += f"/sk{self.split_k}"
        if self.is_gluon:
            key += f"/e{self.epi_n}"
        if self.subtile:
            key += "/sub"
        return key

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GemmConfig:
        """Strict: an unknown field or a field of the wrong type raises ValueError naming it."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(f"unknown GemmConfig field(s) {unknown}; known: {sorted(fields)}")
        for name, value in d.items():
            want = (str,) if name == "kernel" else (bool,) if name == "subtile" else (int,)
            if not isinstance(value, want) or (want == (int,) and isinstance(value, bool)):
                raise ValueError(f"GemmConfig.{name} = {value!r}: expected {want[0].__name__}")
        cfg = cls(**d)
        why = cfg.problem()
        if why:
            raise ValueError(f"{cfg.key()}: {why}")
        return cfg

    # -- rules ---------------------------------------------------------------------------------
    def problem(self, out_bytes: int = 4, swiglu: bool = False) -> str | None:
        """None when the config can compile (shared memory for ``out_bytes`` outputs), else why not."""
        if self.kernel not in KERNELS:
            return f"kernel must be one of {KERNELS}"
        if min(self.block_m, self.block_n, self.block_k) < 16 or any(
            v & (v - 1) for v in (self.block_m, self.block_n, self.block_k)
        ):
            return "block sizes must be powers of two >= 16"
        if self.num_stages < 1 or self.num_warps not in (1, 2, 4, 8, 16) or self.split_k < 1 or self.group_m < 1:
            return "num_stages >= 1, num_warps a power of two <= 16, split_k >= 1, group_m >= 1"
        if swiglu and self.split_k > 1:
            return "the SwiGLU epilogue cannot run split-K"
        if self.kernel == "triton-tma" and self.split_k > 1:
            return "triton-tma runs unsplit (split-K runs in the pointer kernel)"
        if self.subtile and self.kernel != "triton-tma":
            return "subtile is a triton-tma option"
        if self.is_gluon:
            return _gluon_config_problem(self, out_bytes, swiglu)
        return None

    def uses_wgmma_on_hopper(self) -> bool:
        return self.is_gluon or (self.block_m % 64 == 0 and self.num_warps % 4 == 0 and self.block_k >= 32)

    def smem_bytes(self, out_bytes: int = 4, swiglu: bool = False) -> int:
        """Shared memory: the pipelined int8 A and B tiles, plus the epilogue's TMA staging."""
        ring = self.num_stages * (self.block_m + self.block_n) * self.block_k
        if self.is_gluon:
            consumers_rows = 2 * gluon_rows_per_consumer(self)
            nbuf = gluon_epi_bufs(self, out_bytes, swiglu)
            return ring + consumers_rows * nbuf * self.epi_n * out_bytes + 2 * self.num_stages * 8
        if self.kernel == "triton-tma":
            ring += self.block_m * (self.block_n // (2 if self.subtile or swiglu else 1)) * out_bytes
        return ring


# -- Gluon rules (pure Python: the host side of gemm_gluon.py and the offline compile check) ------


def split_plan(cfg: GemmConfig, K: int) -> tuple[int, int]:
    """(k steps per split KPS, effective split count S) of the Gluon kernel for ``cfg.split_k``:
    KPS = cdiv(k_tiles, split_k), S = cdiv(k_tiles, KPS), so every split has >= 1 k step and only the last
    may be shorter. S == 1: the unsplit kernel (no workspace)."""
    k_tiles = -(-K // cfg.block_k)
    if cfg.split_k <= 1 or k_tiles <= 1:
        return k_tiles, 1
    kps = -(-k_tiles // cfg.split_k)
    return kps, -(-k_tiles // kps)


def pointer_k_split(cfg: GemmConfig, K: int) -> tuple[int, bool]:
    """(K range per split of the portable pointer kernel, a multiple of BLOCK_K; whether no K masking is needed)."""
    per_split = -(-K // cfg.split_k)
    k_per_split = -(-per_split // cfg.block_k) * cfg.block_k
    return k_per_split, K % k_per_split == 0


def gluon_rows_per_consumer(cfg: GemmConfig) -> int:
    """Cooperative: each of the two consumer warpgroups owns half the rows; ping-pong: whole tiles."""
    return cfg.block_m // 2 if cfg.kernel == "gluon-ws" else cfg.block_m


def gluon_instr_n(block_n: int) -> int:
    """n of the m64nNk32 int8 wgmma covering a consumer warpgroup's [rows, block_n] accumulator
    (rows a multiple of 64: the warpgroup's 4 warps all lie along M)."""
    for n in _INT8_WGMMA_N:
        if block_n % n == 0:
            return n
    raise ValueError(f"no int8 wgmma shape for block_n = {block_n}")


def gluon_epi_bufs(cfg: GemmConfig, out_bytes: int = 2, swiglu: bool = False) -> int:
    """Epilogue staging buffers per consumer: two alternate (store_wait(1) frees the older) when the
    subtile count per tile is even and they fit; else one. SwiGLU stores half the subtiles."""
    subtiles = cfg.block_n // (2 if swiglu else 1) // cfg.epi_n
    ring = cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k
    two = ring + 2 * gluon_rows_per_consumer(cfg) * 2 * cfg.epi_n * out_bytes + 2 * cfg.num_stages * 8
    return 1 if subtiles % 2 or two > GLUON_SMEM_LIMIT else 2


def _gluon_config_problem(cfg: GemmConfig, out_bytes: int, swiglu: bool) -> str | None:
    """Why a Gluon config cannot compile (wgmma shape, shared memory), else None: a rule of the config alone."""
    rows = gluon_rows_per_consumer(cfg)
    if rows % 64 or cfg.num_warps != 4:
        return "wgmma needs >= 64 rows per consumer warpgroup (multiple of 64); num_warps is the warpgroup's 4"
    if cfg.block_k % 32 or cfg.block_k > 128 or cfg.epi_n < 16 or cfg.block_n % cfg.epi_n:
        return "block_k must be 32..128 (multiple of 32); epi_n >= 16 must divide block_n"
    if cfg.num_stages < 2:
        return "num_stages >= 2"
    if swiglu and (cfg.block_n // 2) % cfg.epi_n:
        return "SwiGLU: epi_n must divide block_n // 2 (a subtile may not straddle gate and up)"
    try:
        gluon_instr_n(cfg.block_n)
    except ValueError as exc:
        return str(exc)
    if cfg.smem_bytes(out_bytes, swiglu) > GLUON_SMEM_LIMIT:
        return f"shared memory {cfg.smem_bytes(out_bytes, swiglu)} B > {GLUON_SMEM_LIMIT} B"
    return None


# -- search spaces ---------------------------------------------------------------------------------


def _c(kernel: str, tile: str, warps: int = 4, stages: int = 3, **kw) -> GemmConfig:
    bm, bn, bk = (int(v) for v in tile.split("x"))
    return GemmConfig(kernel, bm, bn, bk, num_warps=warps, num_stages=stages, **kw)


_GLUON_SM90 = [  # faster than the Triton persistent kernel on the H100 at the large Ideogram shapes
    _c("gluon-ws", "128x256x128", stages=4),
    _c("gluon-ws", "128x256x128", stages=3, epi_n=128),
    _c("gluon-ws", "256x128x128", stages=3),
    _c("gluon-pingpong", "128x128x128", stages=5),
    _c("gluon-ws", "128x256x128", stages=4, group_m=16),
    _c("gluon-pingpong", "128x128x128", stages=5, group_m=16),
    # llm_cond_proj (M ~ 512, N 4608, K 53248: 72 tiles of 128x256 for 132 SMs): split K
    _c("gluon-ws", "128x256x128", stages=4, split_k=5),
    _c("gluon-ws", "128x256x128", stages=4, split_k=6),
    _c("gluon-pingpong", "128x128x128", stages=5, split_k=4),
]
_TMA_SM90 = [  # best portable kernel on the H100 at every large shape: 128x256x128, 8 warps, subtiled
    _c("triton-tma", "128x256x128", warps=8, stages=3, subtile=True),
    _c("triton-tma", "128x256x128", warps=8, stages=3, group_m=16, subtile=True),
    _c("triton-tma", "256x128x128", warps=8, stages=3, subtile=True),
    _c("triton-tma", "128x128x128", warps=4, stages=4, subtile=True),
]
_TMA_SM100 = [c for c in _TMA_SM90 if c.block_m * c.block_n <= 128 * 128]
_POINTER_SM90 = [
    _c("triton", "128x128x128", warps=4, stages=3),
    _c("triton", "128x128x128", warps=4, stages=4),
    _c("triton", "128x256x128", warps=8, stages=3),
    _c("triton", "256x128x128", warps=8, stages=3),
    _c("triton", "128x256x64", warps=8, stages=4),
    _c("triton", "64x128x128", warps=4, stages=4),
] + [_c("triton", "128x128x128", warps=4, stages=3, split_k=s) for s in (2, 4, 6, 8)]
_LARGE_SM80 = [
    _c("triton", "128x128x64", warps=4, stages=4),
    _c("triton", "128x256x64", warps=8, stages=3),
    _c("triton", "256x128x64", warps=8, stages=3),
    _c("triton", "128x128x128", warps=4, stages=3),
    _c("triton", "128x128x128", warps=8, stages=4),
    _c("triton", "64x128x128", warps=4, stages=4),
    _c("triton", "128x64x128", warps=4, stages=4),
]
_LARGE_SM86 = [  # <= 96 KB of pipelined tiles
    _c("triton", "128x128x64", warps=4, stages=4),
    _c("triton", "128x128x64", warps=8, stages=3),
    _c("triton", "128x256x64", warps=8, stages=3),
    _c("triton", "256x128x64", warps=8, stages=3),
    _c("triton", "128x128x128", warps=4, stages=2),
    _c("triton", "64x128x128", warps=4, stages=3),
    _c("triton", "128x64x128", warps=4, stages=3),
    _c("triton", "64x64x128", warps=4, stages=4),
]
_SPLITK_AMPERE = [_c("triton", "128x128x64", warps=4, stages=4, split_k=s) for s in (2, 4, 8)]
_SMALL_M = [  # M <= 64 (adaLN modulation, short prompts): mma.sync tiles
    _c("triton", "16x64x128", stages=4, group_m=1),
    _c("triton", "16x128x128", stages=4, group_m=1),
    _c("triton", "32x64x128", stages=4, group_m=1),
    _c("triton", "32x128x128", stages=3, group_m=1),
    _c("triton", "64x64x128", stages=4, group_m=1),
    _c("triton", "64x128x128", stages=3, group_m=1),
    _c("triton", "16x128x128", stages=4, group_m=1, split_k=4),
    _c("triton", "32x128x128", stages=3, group_m=1, split_k=4),
]

CONFIG_SPACES: dict[str, list[GemmConfig]] = {
    "sm90": _GLUON_SM90 + _TMA_SM90 + _POINTER_SM90 + _SMALL_M,
    "sm100": _TMA_SM100 + _POINTER_SM90 + _SMALL_M,
    "sm80": _LARGE_SM80 + _SPLITK_AMPERE + _SMALL_M,
    "sm86": _LARGE_SM86 + _SPLITK_AMPERE + _SMALL_M,
    "sm89": _LARGE_SM86 + _SPLITK_AMPERE + _SMALL_M,
    "sm120": _LARGE_SM86 + _SPLITK_AMPERE + _SMALL_M,
}
# Shared memory per block (opt-in) when the device cannot be asked: conservative.
SMEM_LIMIT = {
    "sm80": 163 * 1024,
    "sm86": 99 * 1024,
    "sm89": 99 * 1024,
    "sm90": 227 * 1024,
    "sm100": 227 * 1024,
    "sm120": 99 * 1024,
}
# What each family is, in words (`info`)
FAMILIES = {
    "sm80": "Ampere A100: 163 KB shared memory per block, mma.sync int8",
    "sm86": "Ampere RTX 30xx / A40 / Orin: ~99 KB shared memory per block, mma.sync int8",
    "sm89": "Ada RTX 40xx / L40: ~99 KB shared memory per block, mma.sync int8 and e4m3",
    "sm90": "Hopper H100 / H200: 227 KB shared memory per block, wgmma + TMA",
    "sm100": "datacenter Blackwell B200 / B300: 227 KB shared memory per block, tcgen05 tensor cores",
    "sm120": "consumer Blackwell RTX 50 / GB10: ~99 KB shared memory per block, mma.sync int8 and e4m3, no wgmma",
}


# The fp8 GEMM's one tile per family (fp8_gemm.py). On Hopper the fastest of those measured at the w2 shapes (M
# 4096-4608, N 4608, K 12288; docs/performance.md, "FP8 for the protected layers"): 128x256x128, 8 warps, 3 stages.
# The ~99 KB families (Ada, consumer Blackwell): a 128x128x64 tile in 4 stages fits (64 KiB); B200 (227 KB) takes
# Hopper's tile. Reasoned, not measured, on every family but sm90: those check themselves first (self_check.py).
_FP8_LARGE = _c("triton", "128x256x128", warps=8, stages=3)
_FP8_SMALL_SMEM = _c("triton", "128x128x64", warps=4, stages=4)
FP8_TILES = {"sm89": _FP8_SMALL_SMEM, "sm90": _FP8_LARGE, "sm100": _FP8_LARGE, "sm120": _FP8_SMALL_SMEM}
_FP8_INTERPRETER_TILE = _c("triton", "32x32x64", warps=4, stages=2, group_m=4)  # the CPU interpreter (tests)


def fp8_tile(arch: str) -> GemmConfig:
    """The fp8 GEMM's tile on family ``arch`` ("cpu": the interpreter's small tile); KeyError for a family without
    one (fp8_gemm.fp8_tile_problem says why)."""
    return _FP8_INTERPRETER_TILE if arch == "cpu" else FP8_TILES[arch]


def m_bucket(M: int) -> int:
    """Tuning key bucket for the token count: the next power of two, at least 16."""
    b = 16
    while b < M:
        b *= 2
    return b


def config_space(arch: str, M: int, smem_limit: int | None = None, kernels=KERNELS) -> list[GemmConfig]:
    """Candidate configs for ``arch`` that fit its shared memory, make sense for M and run one of ``kernels``."""
    space = CONFIG_SPACES.get(arch, CONFIG_SPACES["sm80"])
    limit = smem_limit or SMEM_LIMIT.get(arch, 99 * 1024)
    # a little headroom for the epilogue / barriers
    out = [c for c in space if c.kernel in kernels and c.smem_bytes() <= limit - 2048]
    if M <= 64:
        return [c for c in out if c.block_m <= 64]
    return [c for c in out if c.block_m >= 64 or M <= 128]


def heuristic_config(arch: str, M: int, N: int, K: int) -> GemmConfig:
    """A sensible untuned pick of the portable kernel (no table entry, no autotuning)."""
    if M <= 16:
        return _c("triton", "16x128x128", stages=4, group_m=1)
    if M <= 64:
        return _c("triton", f"{32 if M <= 32 else 64}x128x128", stages=3, group_m=1)
    mma_sync = arch in ("sm80", "sm86", "sm89", "sm120")  # the mma.sync families: a 64-deep K step in 4 stages
    base = _c("triton", "128x128x64", stages=4) if mma_sync else _c("triton", "128x128x128")
    tiles = -(-M // base.block_m) * -(-N // base.block_n)
    if K >= 16384 and tiles < 256:
        # few output tiles and a long K: split K so every SM gets work
        return dataclasses.replace(base, split_k=8 if tiles <= 64 else 4 if tiles <= 160 else 2)
    return base


def portable_twin(cfg: GemmConfig, swiglu: bool = False) -> GemmConfig:
    """The portable Triton config a Gluon pick is demoted to (same tile where the portable kernels can run it)."""
    if not cfg.is_gluon:
        return cfg
    if cfg.split_k > 1:
        return _c("triton", "128x128x128", split_k=cfg.split_k, group_m=cfg.group_m)
    big = cfg.block_m * cfg.block_n >= 128 * 256
    return _c(
        "triton-tma",
        f"{cfg.block_m}x{cfg.block_n}x128",
        warps=8 if big else 4,
        stages=3 if big else 4,
        group_m=cfg.group_m,
        subtile=not swiglu,
    )
