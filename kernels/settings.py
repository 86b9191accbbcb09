"""The pack's switches: every environment variable it reads, read at one point with one parser.

Users set these before ComfyUI (or a benchmark) starts. The pack reads them together on first use into a snapshot
and keeps it for the process (``current``); ``reload`` reads them again, for tests and for benchmarks that change
them between runs in one process. No other module reads these variables.

On/off switches take 1/on/true/yes or 0/off/false/no, in any case. A value that is not understood never raises: it
logs one warning naming the variable, the value, the values it takes and the default used instead, and the GEMM
panel lists it among its notes.

User switches (``SWITCHES``):
  IDEOGRAM4_INT8_GEMM_PATH     auto | triton-int8 | cublas-int8 | dequant-bf16: force one GEMM path where it can run
  IDEOGRAM4_INT8_GEMM_TIMING   on | off: per-path GEMM timing from the start (unset: the panel's setting decides)
  IDEOGRAM4_INT8_CACHE_DIR     a folder for the autotune, CPU GEMM and self-check caches
  IDEOGRAM4_INT8_CUDA_GRAPHS   auto | on | off: replay each sampling pass as a CUDA graph
  IDEOGRAM4_INT8_STREAM        on | off: stream the blocks that do not fit (off: ComfyUI's own partial load)
  IDEOGRAM4_INT8_STREAM_SLOTS  a whole number >= 1: device slots per streamed model
  IDEOGRAM4_INT8_GLUON         on | off: the Hopper Gluon GEMM (off: the portable Triton kernel)
  IDEOGRAM4_INT8_ATTENTION     auto | comfyui | sdpa | int8 | fp8: the pack's measured attention choice, ComfyUI's
                               own, or one attention path forced where it can run
Experiments (``EXPERIMENTS``) turn parts of the pack off or back to ComfyUI's own code, for A/B measurements; they
are one comma-separated list, as ComfyUI's ``--fast`` is:
  IDEOGRAM4_INT8_EXPERIMENTS="block-norms=comfyui,no-resident-conds,stream-whole-blocks"
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

log = logging.getLogger("comfyui_ideogram4_int8")

GEMM_PATH = "IDEOGRAM4_INT8_GEMM_PATH"
GEMM_TIMING = "IDEOGRAM4_INT8_GEMM_TIMING"
CACHE_DIR = "IDEOGRAM4_INT8_CACHE_DIR"
CUDA_GRAPHS = "IDEOGRAM4_INT8_CUDA_GRAPHS"
STREAM = "IDEOGRAM4_INT8_STREAM"
STREAM_SLOTS = "IDEOGRAM4_INT8_STREAM_SLOTS"
GLUON = "IDEOGRAM4_INT8_GLUON"
ATTENTION = "IDEOGRAM4_INT8_ATTENTION"
EXPERIMENTS_VAR = "IDEOGRAM4_INT8_EXPERIMENTS"
PREFIX = "IDEOGRAM4_INT8_"  # a variable with this prefix that is none of the above is named in a warning

ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")
ON_OFF = "1/on/true/yes or 0/off/false/no"
MAX_SHOWN = 60  # characters of a value quoted in a warning


@dataclasses.dataclass(frozen=True)
class Switch:
    """One user switch. ``kind``: "on-off" (a bool), "choice" (one of ``choices``), "count" (an int >= 1) or
    "folder" (any text); ``default``: the value when unset or not understood; ``what``: what it sets, for the
    warning about a value not understood."""

    kind: str
    default: object
    what: str
    choices: tuple[str, ...] = ()


# the GEMM paths a user may force (kernels/registry.py names them; a test keeps the two in step)
GEMM_PATHS = ("triton-int8", "cublas-int8", "dequant-bf16")

# the attention paths a user may force (kernels/attention_choice.py names them; a test keeps the two in step)
ATTENTION_PATHS = ("sdpa", "int8", "fp8")

SWITCHES = {
    GEMM_PATH: Switch(
        "choice", "auto", "the GEMM path every quantized linear takes where it can", ("auto", *GEMM_PATHS)
    ),
    GEMM_TIMING: Switch("on-off", None, "per-path GEMM timing from the start (unset: the panel's setting decides)"),
    CACHE_DIR: Switch("folder", None, "the folder of the autotune, CPU GEMM and self-check caches"),
    CUDA_GRAPHS: Switch("choice", "auto", "replay each sampling pass as a CUDA graph", ("auto", "on", "off")),
    STREAM: Switch("on-off", True, "stream the blocks that do not fit on the card (off: ComfyUI's partial load)"),
    STREAM_SLOTS: Switch("count", None, "device slots per streamed model (unset: 3 for pieces, 2 for whole blocks)"),
    GLUON: Switch("on-off", True, "the Hopper Gluon GEMM kernels (off: the portable Triton kernel)"),
    ATTENTION: Switch(
        "choice",
        "auto",
        "attention: the pack's measured choice (auto), ComfyUI's own, or one path forced",
        ("auto", "comfyui", *ATTENTION_PATHS),
    ),
}


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One entry of the experiments list: a flag (``values`` empty) or ``name=value`` with a value of ``values``."""

    what: str
    values: tuple[str, ...] = ()


# the smoothing-fold modes of ideogram4/smooth_fold.py (a test keeps the two in step)
SMOOTH_FOLD_MODES = ("geo", "max", "min", "w1", "ratio", "off")

EXPERIMENTS = {
    "no-autotune": Experiment("no GEMM autotuning: the shipped table's tile, else the heuristic's"),
    "cpu-gemm": Experiment(
        "state which CPU matmul is fast instead of measuring it (int8: torch._int_mm)", ("int8", "float")
    ),
    "no-fast-launch": Experiment("every Triton kernel launched through kernel[grid] (no cached launches)"),
    "block-norms": Experiment(
        "the blocks' modulated norms as ComfyUI's ops (comfyui), or fused without the quantized hand-off (no-handoff)",
        ("comfyui", "no-handoff"),
    ),
    "rope": Experiment("ComfyUI's own q/k norm + RoPE instead of the pack's fused kernel", ("comfyui",)),
    "no-fuse-gate-up": Experiment("the FFN's w1 and w3 as two linears instead of one fused call"),
    "smooth-fold": Experiment("the smoothing fold's gate/up mode (off: every divide at run time)", SMOOTH_FOLD_MODES),
    "stream-whole-blocks": Experiment("low-VRAM streaming of whole blocks through 2 slots instead of pieces"),
    "upload": Experiment(
        "a MODEL's weights to the card as ComfyUI's load moves them, module by module (comfyui), instead of one "
        "staged bulk copy; or that copy queued, neither the host nor ComfyUI's load waiting for it (overlap)",
        ("comfyui", "overlap"),
    ),
    "host-copies": Experiment(
        "a MODEL's host tensors freed once on the card, as ComfyUI does (off), instead of kept so an unload drops "
        "the card copies",
        ("off",),
    ),
    "park": Experiment(
        "a MODEL unloaded whole is counted as unloaded, so its next load makes ComfyUI unload dynamic models whole "
        "(off), instead of taking back its room from their pages",
        ("off",),
    ),
    "pin-copy": Experiment(
        "a streamed weight that lies in its checkpoint's file mapping pinned in place (off), instead of copied to "
        "fresh host memory first",
        ("off",),
    ),
    "pin-ahead": Experiment(
        "a MODEL's weights pinned only where a plan streams them (off), instead of pinned on a worker thread between "
        "the load and the first sampling run",
        ("off",),
    ),
    "pass-estimate": Experiment("ComfyUI's doubled-batch memory estimate under the pack's sampler", ("comfyui",)),
    "no-resident-conds": Experiment("the text context cast to the device in every model call, as ComfyUI does"),
    "self-check": Experiment(
        "the kernels' first-use check against their twins on every GPU, the measured ones too (on), or on none (off)",
        ("on", "off"),
    ),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """One reading of the environment: ``values`` per switch, the ``experiments`` listed (name -> value, "" for a
    flag), the ``raw`` text of every variable that was set, and a ``problems`` message per variable not understood."""

    values: Mapping[str, object]
    experiments: Mapping[str, str]
    raw: Mapping[str, str]
    problems: Mapping[str, str]


def read(environ: Mapping[str, str]) -> Settings:
    """Parse ``environ`` (never raises, never logs): what ``reload`` installs."""
    values, raw, problems = {}, {}, {}
    for name, switch in SWITCHES.items():
        text = environ.get(name, "").strip()
        if text:
            raw[name] = text
        values[name], problem = _parse(switch, text)
        if problem:
            problems[name] = (
                f"{name}={_shown(text)} is not understood: {problem} ({switch.what}); using {_default_text(switch)}"
            )
    text = environ.get(EXPERIMENTS_VAR, "").strip()
    if text:
        raw[EXPERIMENTS_VAR] = text
    experiments, wrong = _parse_experiments(text)
    if wrong:
        problems[EXPERIMENTS_VAR] = f"{EXPERIMENTS_VAR}: {'; '.join(wrong)}; those entries are ignored"
    known = (*SWITCHES, EXPERIMENTS_VAR)
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in known):
        problems[name] = (
            f"{name} is not a setting of this pack and is ignored: the settings are {', '.join(known)} "
            f"(experiments: {', '.join(EXPERIMENTS)})"
        )
    return Settings(values, experiments, raw, problems)


def _parse(switch: Switch, text: str) -> tuple[object, str | None]:
    """(value, None) or (the default, what the switch takes)."""
    if not text:
        return switch.default, None
    low = text.lower()
    if switch.kind == "folder":
        return text, None
    if switch.kind == "on-off":
        if low in ON:
            return True, None
        if low in OFF:
            return False, None
        return switch.default, f"it takes {ON_OFF}"
    if switch.kind == "choice":
        if switch.choices[1:] == ("on", "off"):  # auto / on / off: the on-off spellings too
            low = "on" if low in ON else "off" if low in OFF else low
        if low in switch.choices:
            return low, None
        return switch.default, f"it takes one of {', '.join(switch.choices)}"
    if switch.kind == "count":
        if low.isdigit() and int(low) >= 1:
            return int(low), None
        return switch.default, "it takes a whole number >= 1"
    raise AssertionError(f"switch kind {switch.kind!r}")  # pragma: no cover - SWITCHES is fixed


def _default_text(switch: Switch) -> str:
    if switch.default is None:
        return "the default (unset)"
    if isinstance(switch.default, bool):
        return f"the default ({'on' if switch.default else 'off'})"
    return f"the default ({switch.default})"


def _parse_experiments(text: str) -> tuple[dict[str, str], list[str]]:
    """({name: value}, problems) of a comma-separated list; a later entry of the same name wins."""
    found, wrong = {}, []
    for entry in (e.strip().lower() for e in text.split(",")):
        if not entry:
            continue
        name, _, value = (part.strip() for part in entry.partition("="))
        spec = EXPERIMENTS.get(name)
        if spec is None:
            wrong.append(f"{_shown(name)} is not an experiment (known: {', '.join(EXPERIMENTS)})")
        elif not spec.values and ("=" in entry):
            wrong.append(f"{name} takes no value (got {_shown(entry)})")
        elif spec.values and value not in spec.values:
            wrong.append(f"{name} takes {name}={'|'.join(spec.values)} (got {_shown(entry)})")
        else:
            found[name] = value
    return found, wrong


def _shown(text: str) -> str:
    return repr(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "...")


_STATE: dict[str, Settings | None] = {"current": None}


def current() -> Settings:
    """This run's settings: read on the first call, then kept until ``reload``."""
    snapshot = _STATE["current"]
    return snapshot if snapshot is not None else reload()


def reload(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings again (``environ``: instead of the process environment) and keep them; each problem that
    the previous reading did not have is logged as one warning."""
    before = _STATE["current"]
    snapshot = read(os.environ if environ is None else environ)
    for name, message in snapshot.problems.items():
        if before is None or before.problems.get(name) != message:
            log.warning("Ideogram4 INT8: %s", message)
    _STATE["current"] = snapshot
    return snapshot


# -- the switches, one function each --------------------------------------------------------------------------


def gemm_path() -> str | None:
    """The forced GEMM path (one of ``GEMM_PATHS``), or None: the fastest path that can run."""
    path = current().values[GEMM_PATH]
    return None if path == "auto" else path


def gemm_timing() -> bool | None:
    """Per-path GEMM timing from the start: True / False, or None (unset: the panel's setting decides)."""
    return current().values[GEMM_TIMING]


def cache_dir() -> str | None:
    """The cache folder asked for, or None (the pack's default folder)."""
    return current().values[CACHE_DIR]


def cuda_graphs() -> str:
    """ "auto", "on" or "off": whether the pack's sampler replays its passes as CUDA graphs."""
    return current().values[CUDA_GRAPHS]


def stream() -> bool:
    """Whether blocks that do not fit on the card are streamed by the pack (else ComfyUI's partial load runs)."""
    return current().values[STREAM]


def stream_slots() -> int | None:
    """Device slots per streamed model, or None (the streaming unit's default)."""
    return current().values[STREAM_SLOTS]


def gluon() -> bool:
    """Whether the Hopper Gluon GEMM kernels may run."""
    return current().values[GLUON]


def attention() -> str:
    """ "auto" (the pack's attention, chosen per shape by measurement), "comfyui" (ComfyUI's own), or a forced path
    of ``ATTENTION_PATHS`` (where it cannot run, SDPA runs and says why)."""
    return current().values[ATTENTION]


def experiment(name: str) -> str | None:
    """The value the experiment ``name`` was given ("" for a flag), or None when it is not listed."""
    if name not in EXPERIMENTS:
        raise KeyError(f"{name!r} is not an experiment: {', '.join(EXPERIMENTS)}")
    return current().experiments.get(name)


def flag(name: str) -> bool:
    """Whether the flag experiment ``name`` is listed."""
    return experiment(name) is not None


def said(name: str) -> str:
    """How the user asked for a switch or an experiment, for a reason shown in a log or the panel:
    ``IDEOGRAM4_INT8_CUDA_GRAPHS=off``, ``IDEOGRAM4_INT8_EXPERIMENTS has rope=comfyui``."""
    if name in EXPERIMENTS:
        value = current().experiments.get(name)
        return f"{EXPERIMENTS_VAR} has {name}{'=' + value if value else ''}"
    return f"{name}={current().raw.get(name, '')}"


def problems() -> dict[str, str]:
    """A message per variable whose value was not understood (or that is not a setting), by variable."""
    return dict(current().problems)


__all__ = [
    "ATTENTION",
    "ATTENTION_PATHS",
    "CACHE_DIR",
    "CUDA_GRAPHS",
    "EXPERIMENTS",
    "EXPERIMENTS_VAR",
    "GEMM_PATH",
    "GEMM_PATHS",
    "GEMM_TIMING",
    "GLUON",
    "ON",
    "OFF",
    "SMOOTH_FOLD_MODES",
    "STREAM",
    "STREAM_SLOTS",
    "SWITCHES",
    "Settings",
    "attention",
    "cache_dir",
    "cuda_graphs",
    "current",
    "experiment",
    "flag",
    "gemm_path",
    "gemm_timing",
    "gluon",
    "problems",
    "read",
    "reload",
    "said",
    "stream",
    "stream_slots",
]
