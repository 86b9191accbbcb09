"""What the first-use self-check (self_check.py) launches on a device: the kernels Ideogram 4's own shapes will run
there, on problems small enough to be fast.

Triton compiles one kernel per specialization: the constexprs (tile, warps, stages, epilogue flags, SPLIT_K, the
persistent kernels' NUM_PROGRAMS), the dtypes, a tensor descriptor's block, and every integer argument's class
(== 1, a multiple of 16, neither). A check on other shapes compiles kernels the model never runs; so each case here
takes the config the model's call picks on this device without timing anything (``tuning.PICKER.planned``: the
process's or the autotune cache's pick, the shipped table's, else the heuristic, which autotuning compiles among its
trials) and shrinks M, N and K only as far as every specialization stays the model's. Its compiles are then the
ones the model's first pass needs anyway, and the model's pass reuses them.

Each case still crosses tile edges: M and N end inside a tile (keeping their class), and K spans at least two
BLOCK_K steps, or two per split. A persistent kernel keeps the model's program count: at least that many tiles.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch

from . import settings
from .configs import GemmConfig, fp8_tile, pointer_k_split, portable_twin, split_plan
from .env import arch_name, capability, gpu_name, interpreter_mode, sm_count, triton_line
from .tuning import EPILOGUE_LINEAR, EPILOGUE_PAIR, PICKER


@dataclasses.dataclass(frozen=True)
class ModelGemm:
    """One fused GEMM call of the model: q [m, k] times w [n, k] (``pair``: the SwiGLU gate/up pair, n = F, the
    rows of each of w1 and w3), with a bias or without."""

    name: str
    m: int
    n: int
    k: int
    bias: bool = False
    pair: bool = False

    @property
    def epilogue(self) -> str:
        return EPILOGUE_PAIR if self.pair else EPILOGUE_LINEAR

    @property
    def key_n(self) -> int:
        """The tuning key's N (the pair computes 2F outputs)."""
        return 2 * self.n if self.pair else self.n


def _block(m: int) -> list[ModelGemm]:
    return [
        ModelGemm("attention.qkv", m, 13824, 4608),
        ModelGemm("attention.o", m, 4608, 4608),
        ModelGemm("feed_forward.w1/w3", m, 12288, 4608, pair=True),
        ModelGemm("feed_forward.w2", m, 4608, 12288),
    ]


# Ideogram 4 at 1024x1024: the conditional pass (512 text + 4096 image tokens), the unconditional one (4096 image
# tokens), a block's modulation (one row per image), the text projection (512 text tokens). Biases as the model has
# them (ideogram4/config.py); bf16 activations.
MODEL_GEMMS = (
    *_block(4608),
    *_block(4096),
    ModelGemm("adaln_modulation", 1, 18432, 512, bias=True),
    ModelGemm("llm_cond_proj", 512, 4608, 53248, bias=True),
)
# The activations the quantizer reads on its own, (rows, K): o's input, w2's (the SwiGLU output), the modulation's,
# the text features (a block's pre-norm quantizes qkv's and w1/w3's inputs itself, with o's K where it does not).
MODEL_QUANT_ROWS = ((4608, 4608), (4608, 12288), (1, 512), (512, 53248))
# The protected FFN down-projection of the fp8 files (fp8_gemm.py): its GEMM and its e4m3 rows
MODEL_FP8_GEMM = ModelGemm("feed_forward.w2 (fp8)", 4608, 4608, 12288)
DTYPE = torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Target:
    """What decides the launches on one device: its config family, GPU name and Triton line (the tuning key), SM
    count (the persistent kernels' programs), whether the Gluon kernels and TMA descriptors run there."""

    arch: str
    gpu: str | None
    line: str
    num_sms: int
    gluon: bool
    tma: bool


def target_of(device: torch.device) -> Target:
    from .backends import _gluon_unavailable

    cc = capability(device) if device.type == "cuda" else None
    gluon = cc is not None and _gluon_unavailable(device, settings.gluon(), interpreter_mode()) is None
    num_sms = sm_count(device) if cc is not None else 4  # the interpreter's programs (gemm_triton._num_sms)
    return Target(arch_name(cc), gpu_name(device), triton_line(), num_sms, gluon, cc is not None and cc >= (9, 0))


@dataclasses.dataclass(frozen=True)
class GemmCase:
    """One launch of the check: ``cfg`` on an [m, k] x [n, k] problem (``pair``: n = F), the model's ``call``."""

    cfg: GemmConfig
    m: int
    n: int
    k: int
    bias: bool
    pair: bool
    call: str

    def name(self) -> str:
        what = "SwiGLU pair" if self.pair else "dequant + bias" if self.bias else "dequant"
        return f"{what} ({self.cfg.key()}, {self.call}: {self.m}x{self.n}x{self.k})"


def model_config(target: Target, call: ModelGemm) -> GemmConfig:
    """The config ``call`` runs on ``target`` (a Gluon pick where the Gluon kernels cannot run: its portable twin)."""
    cfg = PICKER.planned(target.arch, target.gpu, target.line, call.m, call.key_n, call.k, call.epilogue)
    if cfg.is_gluon and not target.gluon:
        cfg = portable_twin(cfg, call.pair)
    return cfg


def gemm_cases(target: Target) -> dict[str, list[GemmCase]]:
    """{backend family: its cases}, one per distinct specialization of the model's calls (``gluon``: the Gluon
    kernels; ``triton``: the portable ones)."""
    out: dict[str, list[GemmCase]] = {"gluon": [], "triton": []}
    seen = set()
    for call in MODEL_GEMMS:
        cfg = model_config(target, call)
        case = small_case(target, cfg, call)
        key = (case.cfg, case.m, case.n, case.k, case.bias, case.pair)
        if key not in seen:
            seen.add(key)
            out[cfg.backend].append(case)
    return out


def fp8_case(target: Target) -> GemmCase:
    return small_case(target, fp8_tile(target.arch), MODEL_FP8_GEMM)


def quant_rows(fp8: bool = False) -> list[tuple[int, int]]:
    """(rows, K) of the quantizer's checks (``fp8``: its e4m3 rows): the model's K (the launch parameters follow
    K), rows of the model's class."""
    rows = ((MODEL_FP8_GEMM.m, MODEL_FP8_GEMM.k),) if fp8 else MODEL_QUANT_ROWS
    return [(1 if m == 1 else 48, k) for m, k in rows]


def digest(target: Target, family: str) -> str:
    """A digest of what ``family``'s check launches on ``target``: a stored pass covers these launches only."""
    if family in ("gluon", "triton"):
        parts = [c.name() for c in gemm_cases(target)[family]]
    elif family == "fp8":
        parts = [fp8_case(target).name()]
    else:
        parts = []
    if family in ("triton", "fp8"):
        parts += [f"quantize {m}x{k}" for m, k in quant_rows(family == "fp8")]
    return hashlib.sha256("; ".join(parts).encode()).hexdigest()[:16]


# -- small problems with the model's specializations -------------------------------------------------------------


def _class(v: int) -> str:
    """How Triton specializes an integer argument: equal to 1, a multiple of 16, or neither."""
    return "1" if v == 1 else "16" if v % 16 == 0 else "-"


def _edge(count: int, width: int, like: int) -> int:
    """A size of ``count`` tiles of ``width``, the last one partial, in the class of ``like``."""
    if like == 1:
        return 1
    return (count - 1) * width + (16 if like % 16 == 0 else 1)


def _k_signature(cfg: GemmConfig, k: int, pair: bool) -> tuple:
    """What of K the kernel's specialization sees."""
    if cfg.is_gluon:
        kps, splits = split_plan(cfg, k)
        return _class(k), _class(kps), splits
    if pair or cfg.kernel == "triton-tma":
        return _class(k), k % cfg.block_k == 0
    k_per_split, even = pointer_k_split(cfg, k)
    return _class(k), _class(k_per_split), -(-k // k_per_split), even


def _small_k(cfg: GemmConfig, call: ModelGemm) -> int:
    """The smallest K of two or more BLOCK_K steps (per split) with the model's signature, else the model's K."""
    want = _k_signature(cfg, call.k, call.pair)
    step = cfg.block_k if call.k % cfg.block_k == 0 else 16
    for k in range(2 * step * max(1, cfg.split_k), call.k, step):
        if _k_signature(cfg, k, call.pair) == want:
            return k
    return call.k


def small_case(target: Target, cfg: GemmConfig, call: ModelGemm) -> GemmCase:
    """``call``'s specialization of ``cfg`` on a small problem: two row and two column tiles, the last partial (a
    persistent kernel: as many tiles as the model's call gives programs), the smallest K of the same signature."""
    width = cfg.block_n // 2 if call.pair else cfg.block_n
    rows, cols = 2, 2
    if cfg.kernel == "triton-tma" and target.tma:  # NUM_PROGRAMS = min(SMs, tiles) is a constexpr
        tiles = -(-call.m // cfg.block_m), -(-call.n // width)
        if tiles[0] * tiles[1] < target.num_sms:
            rows, cols = tiles
        else:
            cols = max(2, -(-target.num_sms // rows))
    return GemmCase(
        cfg,
        _edge(rows, cfg.block_m, call.m),
        _edge(cols, width, call.n),
        _small_k(cfg, call),
        call.bias,
        call.pair,
        call.name,
    )
