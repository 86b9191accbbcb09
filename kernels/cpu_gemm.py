"""What a CPU multiplies fast: torch._int_mm (path ``cublas-int8``) or a dequantized float matmul (``dequant-bf16``).

There are no INT8 tensor cores on a CPU. torch._int_mm is fast only where the CPU has int8 dot products (VNNI, AMX);
without them it is tens of times slower than a float32 matmul of the same shape, and a bf16 matmul there is slower
than float32 too (docs/design/measurements.md). So the CPU's answer is measured once, by a bounded micro-benchmark
at ``SHAPE`` (about a second at most), and cached next to the GPU autotune cache (``IDEOGRAM4_INT8_CACHE_DIR``),
keyed by torch and the CPU. It runs on one thread, the candidates taking turns: on a busy machine several threads
wait on each other and a matmul's time swings many-fold, while the ratio between the kernels, which is what
decides, is a property of one core.

This module only measures; the path decision stays in ``path_choice._auto``, which asks ``choice().why_not_int_mm()``.
The dequantized path computes in ``choice().float_dtype`` on the CPU (float32, or bf16 where bf16 measured faster).
``IDEOGRAM4_INT8_GEMM_PATH=cublas-int8`` still forces torch._int_mm (the path-forcing switch); the experiment
``cpu-gemm=int8`` | ``cpu-gemm=float`` states the answer instead of measuring (the test suite pins ``int8`` so its
expectations do not depend on the CPU that runs it).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import platform
import time

import torch

from . import entry_cache, reference, settings

log = logging.getLogger(__name__)

EXPERIMENT = "cpu-gemm"  # its values: the pins
SHAPE = (280, 256, 768)  # M, K, N: the demo's conditional pass (24 text + 256 image tokens) through a qkv-sized layer
CANDIDATES = ("int8", "float32", "bfloat16")
REPEATS = 5  # rounds; each round runs every candidate once
BUDGET_S = 1.0  # after two rounds, no new round starts past this
CACHE_NAME = "cpu_gemm.json"


@dataclasses.dataclass(frozen=True)
class CpuGemm:
    """The CPU's answer: ``ms`` per candidate (min of repeats at ``SHAPE``), or a ``pin`` (the experiment
    ``cpu-gemm``)."""

    ms: dict
    source: str
    pin: str | None = None

    @property
    def float_dtype(self) -> torch.dtype:
        """The float dtype of the dequantized matmul on this CPU (bf16 only where it measured faster)."""
        if self.ms.get("bfloat16", float("inf")) < self.ms.get("float32", float("inf")):
            return torch.bfloat16
        return torch.float32

    @property
    def int_mm_fast(self) -> bool:
        if self.pin is not None:
            return self.pin == "int8"
        best_float = min(self.ms.get("float32", float("inf")), self.ms.get("bfloat16", float("inf")))
        return self.ms.get("int8", float("inf")) <= best_float

    def why_not_int_mm(self) -> str | None:
        """None when torch._int_mm is this CPU's fast path; else why the dequantized float matmul runs instead."""
        if self.int_mm_fast:
            return None
        return f"{self.evidence()}, so the dequantized float matmul runs; {settings.GEMM_PATH}=cublas-int8 forces it"

    def evidence(self) -> str:
        """What the choice between torch._int_mm and the dequantized float matmul rests on: the times measured at
        ``SHAPE``, or the setting that stated it."""
        if self.pin is not None:
            return f"{self.source} (stated, not measured)"
        m, k, n = SHAPE
        dtype = str(self.float_dtype).replace("torch.", "")
        return (
            f"CPU: torch._int_mm took {self.ms['int8']:.2f} ms against {self.ms[dtype]:.2f} ms for the dequantized "
            f"{dtype} matmul at M={m} K={k} N={n} ({self.source})"
        )

    def summary(self) -> str:
        if self.pin is not None:
            return f"{self.source} (not measured)"
        times = ", ".join(f"{c} {self.ms[c]:.2f} ms" for c in CANDIDATES if c in self.ms)
        return f"{times} at M, K, N = {', '.join(map(str, SHAPE))} ({self.source})"


def choice() -> CpuGemm:
    """This process's answer (measured, or read from the cache, on the first call; then kept)."""
    return _choice(settings.experiment(EXPERIMENT))


def decided() -> CpuGemm | None:
    """The answer if one was made already (never measures: for reports)."""
    pin = settings.experiment(EXPERIMENT)
    if pin is not None:
        return _choice(pin)
    return _LAST[0]


_LAST: list[CpuGemm | None] = [None]


@functools.lru_cache(maxsize=8)
def _choice(pin: str | None) -> CpuGemm:
    if pin is not None:
        return CpuGemm({}, settings.said(EXPERIMENT), pin)
    key = cache_key()
    found = _read_cache().get(key)
    if isinstance(found, dict) and all(isinstance(found.get(c), (int, float)) for c in CANDIDATES):
        result = CpuGemm({c: float(found[c]) for c in CANDIDATES}, "measured earlier on this CPU")
    else:
        result = CpuGemm(measure(), "measured on first use")
        _write_cache(key, result.ms)
        log.info("Ideogram4 INT8: CPU GEMM measured: %s", result.summary())
    _LAST[0] = result
    return result


def clear() -> None:
    """Forget this process's answer (tests; the disk cache stays)."""
    _choice.cache_clear()
    _LAST[0] = None


# -- measuring -------------------------------------------------------------------------------------


def measure() -> dict[str, float]:
    """Milliseconds (min over up to REPEATS rounds, bounded by BUDGET_S) of one W8A8 linear at SHAPE on one thread:
    torch._int_mm with its epilogue, and the dequantized matmul in float32 and in bf16."""
    m, k, n = SHAPE
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    s_tok, s_ch = torch.rand(m, generator=g), torch.rand(n, generator=g)

    def dequant(dtype):
        return lambda: reference.dequant_matmul(q, s_tok, w, s_ch, None, dtype)

    runs = {
        "int8": lambda: reference.epilogue_ref(torch._int_mm(q, w.t()), s_tok, s_ch, None, torch.float32),
        "float32": dequant(torch.float32),
        "bfloat16": dequant(torch.bfloat16),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _time(runs)
    finally:
        torch.set_num_threads(threads)


def _time(runs: dict) -> dict[str, float]:
    """Min ms per candidate; the candidates take turns, so a burst of load elsewhere hits them alike."""
    for fn in runs.values():
        fn()  # warm-up (first-call allocations, oneDNN primitive creation)
    best = dict.fromkeys(runs, float("inf"))
    start = time.perf_counter()
    for round_ in range(REPEATS):
        if round_ >= 2 and time.perf_counter() - start > BUDGET_S:
            break
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: t * 1e3 for name, t in best.items()}


# -- the cache -------------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cache_key() -> str:
    """What the answer depends on: torch (its CPU kernels), the CPU and the instruction set torch uses on it."""
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
    return f"torch {torch.__version__}|{cpu_name()}|{capability}|{'x'.join(map(str, SHAPE))}"


def cache_file() -> pathlib.Path:
    return entry_cache.path_of(CACHE_NAME)


def _read_cache() -> dict:
    return entry_cache.read(CACHE_NAME)


def _write_cache(key: str, ms: dict) -> None:
    entries = _read_cache()
    entries[key] = {c: round(ms[c], 4) for c in CANDIDATES}
    entry_cache.write(CACHE_NAME, entries, "CPU GEMM")
