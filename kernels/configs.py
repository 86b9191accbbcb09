"""GEMM tile configurations: per-architecture search spaces, a heuristic, and the shipped table.

Config spaces (what the autotuner may try), by architecture family:

* ``sm90`` (H100/H200, 227 KB smem/block): measured. Tiles with BLOCK_M % 64 == 0,
  num_warps % 4 == 0 and BLOCK_K >= 32 so Triton emits int8 wgmma.
* ``sm80`` (A100, 163 KB): reasoned, not measured here (no Ampere GPU at hand).
* ``sm86`` / ``sm89`` (RTX 30xx/A40, RTX 40xx/L40, ~99 KB smem/block): reasoned, not measured.
  Every tile's pipelined footprint ``num_stages * (BLOCK_M + BLOCK_N) * BLOCK_K`` stays <= 96 KB.
Small-M tiles (BLOCK_M 16/32) compile to mma.sync everywhere; they serve M <= 64.
Split-K variants serve the long-K, few-tile ``llm_cond_proj`` (M ~ 512, K = 53248).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    persistent: int = 0  # 1: persistent TMA kernel (split_k must be 1)
    warp_specialize: int = 0  # persistent only: producer/consumer warp specialization
    subtile: int = 0  # persistent only: epilogue stored as two half-width tiles
    gluon: int = 0  # Hopper Gluon kernel (gemm_gluon.py): 1 cooperative "ws", 2 "pingpong", 3 "pipelined"
    epi_n: int = 64  # gluon only: epilogue subtile width
    split_add: int = 0  # gluon split-K only: partials TMA-reduce-added into one int32 sum
    n256: int = 0  # gluon 64 x 256 per warpgroup only: one m64n256k32 wgmma per k32 step (wgmma_n256.py)
    sched: int = 0  # gluon ws split_add only: balanced per-CTA work lists of ~sched units (splitk_schedule.py)

    def smem_bytes(self, out_bytes: int = 4) -> int:
        """Shared memory: the pipelined int8 A and B tiles, plus (persistent kernel) the TMA
        staging buffer of the epilogue (BLOCK_M x BLOCK_N, halved when subtiled)."""
        if self.gluon:
            return self.gluon_config().smem_bytes(2)
        pipeline = self.num_stages * (self.block_m + self.block_n) * self.block_k
        if self.persistent:
            pipeline += self.block_m * (self.block_n // (2 if self.subtile else 1)) * out_bytes
        return pipeline

    def uses_wgmma_on_hopper(self) -> bool:
        return self.block_m % 64 == 0 and self.num_warps % 4 == 0 and self.block_k >= 32

    def gluon_config(self):
        """The Gluon kernel's own config for a ``gluon`` entry."""
        from .gemm_gluon import GluonGemmConfig

        return GluonGemmConfig(
            block_m=self.block_m, block_n=self.block_n, block_k=self.block_k, num_stages=self.num_stages,
            group_m=self.group_m, mode=GLUON_MODES[self.gluon], epi_n=self.epi_n, num_warps=self.num_warps,
            split_k=self.split_k, split_add=bool(self.split_add), wgmma_n256=bool(self.n256),
            sched_units=self.sched,
        )  # fmt: skip

    def key(self) -> str:
        if self.gluon:
            return (
                f"gluon-{GLUON_MODES[self.gluon]}_{self.block_m}x{self.block_n}x{self.block_k}"
                f"_g{self.group_m}_s{self.num_stages}_e{self.epi_n}"
            ) + (f"_sk{self.split_k}" + ("a" if self.split_add else "") if self.split_k > 1 else "") + (
                "_n256" if self.n256 else ""
            ) + (f"_lpt{self.sched}" if self.sched else "")
        base = (
            f"{self.block_m}x{self.block_n}x{self.block_k}"
            f"_g{self.group_m}_sk{self.split_k}_w{self.num_warps}_s{self.num_stages}"
        )
        if self.persistent:
            base += "_P" + ("ws" if self.warp_specialize else "") + ("st" if self.subtile else "")
        return base

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GemmConfig:
        return cls(**{f.name: int(d[f.name]) for f in dataclasses.fields(cls) if f.name in d})


C = GemmConfig
GLUON_MODES = {1: "ws", 2: "pingpong", 3: "pipelined"}


def G(
    mode: int, bm: int, bn: int, stages: int, group_m: int = 8, epi_n: int = 64, bk: int = 128, split_k: int = 1,
    split_add: int = 0,
    n256: int = 0,
    sched: int = 0,
) -> GemmConfig:
    """A Gluon (Hopper, warp-specialized) config; num_warps is the consumer warpgroup's 4.
    split_k > 1 (ws / pingpong): int32 partials of tiles x splits units, then one reduce kernel;
    split_add: the partials TMA-reduce-added into one sum instead of one slice per split."""
    return GemmConfig(
        bm, bn, bk, group_m, split_k, 4 if mode != 3 else 8, stages, gluon=mode, epi_n=epi_n, split_add=split_add,
        n256=n256, sched=sched,
    )


_LARGE_SM90 = [
    C(128, 128, 128, 8, 1, 4, 3),
    C(128, 128, 128, 8, 1, 4, 4),
    C(128, 128, 128, 8, 1, 8, 3),
    C(128, 256, 128, 8, 1, 8, 3),
    C(256, 128, 128, 8, 1, 8, 3),
    C(128, 256, 64, 8, 1, 8, 4),
    C(256, 128, 64, 8, 1, 8, 4),
    C(128, 128, 64, 8, 1, 4, 5),
    C(64, 256, 128, 8, 1, 4, 3),
    C(128, 64, 128, 8, 1, 4, 4),
    C(64, 128, 128, 8, 1, 4, 4),
]
_PERSISTENT_SM90 = [  # measured best on H100 at every large Ideogram 4 shape: 128x256x128, 8 warps, subtiled
    C(128, 256, 128, 8, 1, 8, 3, 1, 0, 1),
    C(128, 256, 128, 4, 1, 8, 3, 1, 0, 1),
    C(128, 256, 128, 16, 1, 8, 3, 1, 0, 1),
    C(256, 128, 128, 8, 1, 8, 3, 1, 0, 1),
    C(128, 256, 64, 8, 1, 8, 5, 1, 0, 1),
    C(128, 128, 128, 8, 1, 4, 4, 1, 0, 1),
    C(128, 128, 128, 8, 1, 8, 3, 1, 0, 1),
    C(128, 256, 128, 8, 1, 8, 3, 1, 1, 1),
]
# Gluon kernels (sm_90a only): measured 1.27-1.40x the Triton persistent kernel on H100 at the
# large Ideogram shapes (bench/results/probe-gluon-H100-2026-11-22.log).
_GLUON_SM90 = [
    G(1, 128, 256, 4),
    G(1, 128, 256, 3, epi_n=128),
    G(1, 256, 128, 3),
    G(2, 128, 128, 5),
    G(1, 128, 256, 4, group_m=16),
    G(2, 128, 128, 5, group_m=16),
    # split-K for the long-K, few-tile llm_cond_proj (M ~ 512, N 4608, K 53248: 72 / 144 tiles on
    # 132 SMs unsplit): 72 x 11 = 792 units = 6 waves, 144 x 11 = 1584 = 12 waves
    G(1, 128, 256, 4, split_k=5),
    G(1, 128, 256, 4, split_k=5, split_add=1),
    # one m64n256k32 wgmma per k32 step instead of two n = 128 halves (wgmma_n256.py): -1.4% on H100
    G(1, 128, 256, 4, split_k=5, split_add=1, n256=1),
    G(1, 128, 256, 4, n256=1),
    G(1, 128, 256, 4, split_k=6),
    G(1, 128, 256, 4, split_k=11),
    G(2, 128, 128, 5, split_k=4),
    G(2, 128, 128, 5, split_k=11),
]
_SPLITK_SM90 = [C(128, 128, 128, 8, s, 4, 3) for s in (2, 3, 4, 6, 8)] + [C(64, 128, 128, 8, s, 4, 4) for s in (2, 4)]

_LARGE_SM80 = [
    C(128, 128, 64, 8, 1, 4, 4),
    C(128, 256, 64, 8, 1, 8, 3),
    C(256, 128, 64, 8, 1, 8, 3),
    C(128, 128, 128, 8, 1, 4, 3),
    C(128, 128, 128, 8, 1, 8, 4),
    C(64, 128, 128, 8, 1, 4, 4),
    C(128, 64, 128, 8, 1, 4, 4),
]
_LARGE_SM86 = [  # <= 96 KB of pipelined tiles
    C(128, 128, 64, 8, 1, 4, 4),
    C(128, 128, 64, 8, 1, 8, 3),
    C(128, 256, 64, 8, 1, 8, 3),
    C(256, 128, 64, 8, 1, 8, 3),
    C(128, 128, 128, 8, 1, 4, 2),
    C(64, 128, 128, 8, 1, 4, 3),
    C(128, 64, 128, 8, 1, 4, 3),
    C(64, 64, 128, 8, 1, 4, 4),
]
_SPLITK_AMPERE = [C(128, 128, 64, 8, s, 4, 4) for s in (2, 4, 8)]
_SMALL_M = [
    C(16, 64, 128, 1, 1, 4, 4),
    C(16, 128, 128, 1, 1, 4, 4),
    C(32, 64, 128, 1, 1, 4, 4),
    C(32, 128, 128, 1, 1, 4, 3),
    C(64, 64, 128, 1, 1, 4, 4),
    C(64, 128, 128, 1, 1, 4, 3),
    C(16, 128, 128, 1, 4, 4, 4),
    C(32, 128, 128, 1, 4, 4, 3),
]

CONFIG_SPACES: dict[str, list[GemmConfig]] = {
    "sm90": _GLUON_SM90 + _LARGE_SM90 + _PERSISTENT_SM90 + _SPLITK_SM90 + _SMALL_M,
    "sm100": _LARGE_SM90 + _PERSISTENT_SM90 + _SPLITK_SM90 + _SMALL_M,
    "sm80": _LARGE_SM80 + _SPLITK_AMPERE + _SMALL_M,
    "sm86": _LARGE_SM86 + _SPLITK_AMPERE + _SMALL_M,
    "sm89": _LARGE_SM86 + _SPLITK_AMPERE + _SMALL_M,
}
# Shared memory per block (opt-in) when the device cannot be asked: conservative.
SMEM_LIMIT = {"sm80": 163 * 1024, "sm86": 99 * 1024, "sm89": 99 * 1024, "sm90": 227 * 1024, "sm100": 227 * 1024}
MEASURED_ARCHS = ("sm90",)


def m_bucket(M: int) -> int:
    """Autotune key bucket for the token count: the next power of two, at least 16."""
    b = 16
    while b < M:
        b *= 2
    return b


def config_space(arch: str, M: int, smem_limit: int | None = None) -> list[GemmConfig]:
    """Candidate configs for ``arch`` that fit its shared memory and make sense for M."""
    space = CONFIG_SPACES.get(arch, CONFIG_SPACES["sm80"])
    limit = smem_limit or SMEM_LIMIT.get(arch, 99 * 1024)
    # a little headroom for the epilogue / barriers
    out = [c for c in space if c.smem_bytes() <= limit - 2048]
    if M <= 64:
        out = [c for c in out if c.block_m <= 64]
    else:
        out = [c for c in out if c.block_m >= 64 or M <= 128]
    return out


def heuristic_config(arch: str, M: int, N: int, K: int) -> GemmConfig:
    """A sensible untuned pick (used when neither the shipped table nor autotuning has one)."""
    if M <= 16:
        return C(16, 128, 128, 1, 1, 4, 4)
    if M <= 64:
        return C(32 if M <= 32 else 64, 128, 128, 1, 1, 4, 3)
    if arch in ("sm86", "sm89"):
        base = C(128, 128, 64, 8, 1, 4, 4)
    elif arch == "sm80":
        base = C(128, 128, 64, 8, 1, 4, 4)
    else:
        base = C(128, 128, 128, 8, 1, 4, 3)
    tiles = -(-M // base.block_m) * -(-N // base.block_n)
    if K >= 16384 and tiles < 256:
        # few output tiles and a long K: split K so every SM gets work
        split = 8 if tiles <= 64 else 4 if tiles <= 160 else 2
        return dataclasses.replace(base, split_k=split)
    return base


_TABLE_PATH = pathlib.Path(__file__).with_name("tuned_configs.json")


@functools.lru_cache(maxsize=1)
def shipped_table() -> dict:
    """{arch: {gpu_name: {"N,K,Mbucket": config dict}}} measured on real GPUs (see bench/)."""
    if not _TABLE_PATH.exists():
        return {}
    return json.loads(_TABLE_PATH.read_text())


def shipped_config(arch: str, gpu_name: str | None, M: int, N: int, K: int) -> tuple[GemmConfig, str] | None:
    """Look up the shipped pick: an exact GPU match first, then any GPU of the same arch."""
    per_arch = shipped_table().get(arch, {})
    key = f"{N},{K},{m_bucket(M)}"
    if gpu_name and key in per_arch.get(gpu_name, {}):
        return GemmConfig.from_dict(per_arch[gpu_name][key]), f"shipped table ({gpu_name})"
    for name, entries in per_arch.items():
        if key in entries:
            return GemmConfig.from_dict(entries[key]), f"shipped table ({name}, same arch)"
    return None
