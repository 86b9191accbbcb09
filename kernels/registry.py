"""Which GEMM path every quantized linear really ran, why a faster one was not taken, how long it took and how
often each kernel launched.

The single source of GEMM paths for the frontend panel, the logs and the benchmarks. A call site is a
string such as ``"conditional/layers.0.attention.qkv"``: the part before the first ``/`` is
the model label the panel groups by. Recording is a dict update per call (microseconds next to
a GEMM of hundreds of microseconds).

Optional timing (``enable_timing(True)``): CUDA events around each GEMM; ``end_run()`` then
sums the elapsed time per path for the last run.

Launch counts (``count_launch``): how many times each kernel ran, for the tests and the benchmarks.

What is said about a model as a whole (its attention, graphs, streaming...) is not a GEMM path: it lives in
``model_notes``, apart from this registry, and ``clear`` here leaves it alone.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import torch

PATH_TRITON = "triton-int8"
PATH_FP8 = "triton-fp8"  # a float8 e4m3 weight (a layer kept out of INT8) on fp8 tensor cores: fp8_gemm.py
PATH_CUBLAS = "cublas-int8"
PATH_DEQUANT = "dequant-bf16"
PATH_BF16 = "bf16"
PATHS = (PATH_TRITON, PATH_FP8, PATH_CUBLAS, PATH_DEQUANT, PATH_BF16)
# Fastest first: used to say which faster path was not taken.
PATH_RANK = {p: i for i, p in enumerate(PATHS)}

# What each path id (stable: the panel, the logs and the benchmarks key on it) runs, per device type: the ids stay,
# the words say what runs there. On a CPU "cublas-int8" is torch._int_mm on the CPU's own int8 kernels (no cuBLAS),
# and "dequant-bf16" is the dequantized float matmul, in float32 unless bf16 measured faster (cpu_gemm); where
# torch._int_mm is slow that is the fast CPU path, not a phantom of a faster one.
PATH_LABELS = {
    "cuda": {
        PATH_TRITON: "fused Triton INT8",
        PATH_FP8: "fused Triton FP8 (e4m3, layers kept out of INT8)",
        PATH_CUBLAS: "cuBLAS INT8 (torch._int_mm, not fused)",
        PATH_DEQUANT: "dequant → bf16 (phantom INT8)",
        PATH_BF16: "bf16 (protected)",
    },
    "cpu": {
        PATH_TRITON: "fused Triton INT8 (CUDA GPUs only)",
        PATH_FP8: "fused Triton FP8 (CUDA GPUs with fp8 tensor cores only)",
        PATH_CUBLAS: "CPU INT8 matmul (torch._int_mm)",
        PATH_DEQUANT: "CPU dequantized {dtype} matmul",
        PATH_BF16: "float (protected)",
    },
}


def path_labels(device_type: str, float_dtype: str = "float32") -> dict[str, str]:
    """{path id: what runs} on ``device_type`` ("cuda", "cpu"; any other gets the CPU words); ``float_dtype``: the
    CPU's dequantized matmul dtype."""
    table = PATH_LABELS["cuda" if device_type == "cuda" else "cpu"]
    return {p: label.format(dtype=float_dtype) for p, label in table.items()}


@dataclasses.dataclass
class LayerRecord:
    site: str
    path: str
    reason: str
    n: int
    k: int
    m_last: int
    calls: int = 0
    dtype: str | None = None
    config: str | None = None
    config_source: str | None = None
    last_used: float = 0.0
    fusion: str | None = None  # how a fused pair (SwiGLU gate/up) ran in the last call, or why it did not
    run: str | None = None  # the run (ComfyUI prompt id, else "run <n>" of begin_run) of the last call
    run_calls: int = 0  # calls in that run (``calls`` adds up over every run)

    @property
    def model(self) -> str:
        return self.site.split("/", 1)[0] if "/" in self.site else ""

    @property
    def layer(self) -> str:
        return self.site.split("/", 1)[1] if "/" in self.site else self.site

    def as_dict(self) -> dict:
        return {
            "site": self.site,
            "model": self.model,
            "layer": self.layer,
            "path": self.path,
            "reason": self.reason,
            "shape": {"N": self.n, "K": self.k, "M_last": self.m_last},
            "calls": self.calls,
            "run": self.run,
            "run_calls": self.run_calls,
            "dtype": self.dtype,
            "config": self.config,
            "config_source": self.config_source,
            "fusion": self.fusion,
        }


class GemmRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layers: dict[str, LayerRecord] = {}
        self._anon = 0
        self._timing = False
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._last_run_ms: dict[str, float] | None = None
        self._last_run_wall_ms: float | None = None
        self._run_started: float | None = None
        self.launches: collections.Counter = collections.Counter()
        # per call site: a standing note appended to every reason recorded for it (set by whoever names the
        # site, e.g. "SmoothQuant divide kept at run time: ..."); record() would otherwise overwrite it per call
        self._notes: dict[str, str] = {}
        # per call site: (fusion, why not faster) for the records of a projection whose fused pair ran split in a
        # torch.compile'd graph (set_split_hint: decided when the graph was traced, applied to each record of it)
        self._split_hints: dict[str, tuple[str, str | None]] = {}
        # which run a call belongs to: run_key_source() (ComfyUI: the executing prompt's id), else "run <n>", n
        # counted by begin_run(); each layer counts its calls of its latest run apart from its total
        self.run_key_source = None
        self._run_seq = 0

    def run_key(self) -> str:
        """The run the calls made now belong to (see ``run_key_source``)."""
        source = self.run_key_source
        if source is not None:
            try:
                key = source()
            except Exception:  # noqa: BLE001 - a run label must never break a GEMM
                key = None
            if key:
                return str(key)
        return f"run {self._run_seq}"

    # -- recording ------------------------------------------------------------------------
    def record(
        self,
        site: str | None,
        path: str,
        reason: str,
        m: int,
        n: int,
        k: int,
        dtype: torch.dtype | None = None,
        config: str | None = None,
        config_source: str | None = None,
        fusion: str | None = None,
    ) -> None:
        if path not in PATHS:
            raise ValueError(f"unknown GEMM path {path!r}; expected one of {PATHS}")
        run = self.run_key()
        with self._lock:
            if site is None:
                site = f"unnamed/{n}x{k}"
            note = self._notes.get(site)
            if note:
                reason = f"{reason}; {note}" if reason else note
            if fusion is None and self._split_hints:
                hint = self._split_hints.get(site)
                if hint is not None:
                    fusion, why = hint
                    if why and why not in reason:
                        reason = f"{reason}; {why}" if reason else why
            rec = self._layers.get(site)
            if rec is None:
                rec = self._layers[site] = LayerRecord(site, path, reason, n, k, m)
            rec.path, rec.reason, rec.n, rec.k, rec.m_last = path, reason, n, k, m
            rec.calls += 1
            if rec.run != run:
                rec.run, rec.run_calls = run, 0
            rec.run_calls += 1
            rec.dtype = str(dtype).replace("torch.", "") if dtype is not None else rec.dtype
            rec.config, rec.config_source = config, config_source
            rec.fusion = fusion
            rec.last_used = time.time()

    def note_fusion(self, site: str | None, fusion: str, why_not_faster: str | None = None) -> None:
        """After a call of ``site`` was recorded: how its fused pair ran (``fusion``), and, when the pair ran
        split, why (appended to the record's reason, which says why a faster path was not taken)."""
        if site is None:
            return
        with self._lock:
            rec = self._layers.get(site)
            if rec is None:
                return
            rec.fusion = fusion
            if why_not_faster and why_not_faster not in rec.reason:
                rec.reason = f"{rec.reason}; {why_not_faster}" if rec.reason else why_not_faster

    def set_split_hint(self, site: str | None, fusion: str | None, why_not_faster: str | None = None) -> None:
        """What ``note_fusion`` says after each call, for calls no Python runs after: a projection of a fused pair
        that ran split inside a torch.compile'd graph. Every later record of ``site`` that carries no fusion of its
        own gets ``fusion`` and ``why_not_faster`` (appended to its reason); ``fusion`` None removes the hint."""
        if site is None or (fusion is None and not self._split_hints):
            return
        with self._lock:
            if fusion is None:
                self._split_hints.pop(site, None)
            else:
                self._split_hints[site] = (fusion, why_not_faster)

    def annotate(self, site: str, note: str) -> None:
        """Append ``note`` to the reason of ``site``'s record (once); nothing when the site has no record."""
        with self._lock:
            rec = self._layers.get(site)
            if rec is not None and note not in rec.reason:
                rec.reason = f"{rec.reason}; {note}" if rec.reason else note

    def declare(self, site: str, path: str, reason: str, n: int, k: int, note: str | None = None) -> None:
        """Register a layer before it ever runs (e.g. at load), with zero calls; ``note``: see set_note."""
        if note is not None:
            self.set_note(site, note)
        with self._lock:
            note = self._notes.get(site)
            if note:
                reason = f"{reason}; {note}" if reason else note
            if site not in self._layers:
                self._layers[site] = LayerRecord(site, path, reason, n, k, 0)

    def set_note(self, site: str | None, note: str | None) -> None:
        """A standing note for ``site``, appended to every reason recorded for it (None / "" removes it)."""
        if site is None:
            return
        with self._lock:
            if note:
                self._notes[site] = note
            else:
                self._notes.pop(site, None)

    def note_of(self, site: str) -> str | None:
        return self._notes.get(site)

    def count_launch(self, kernel: str) -> None:
        self.launches[kernel] += 1

    # -- reading --------------------------------------------------------------------------
    def layers(self, model: str | None = None) -> list[LayerRecord]:
        with self._lock:
            recs = list(self._layers.values())
        if model is not None:
            recs = [r for r in recs if r.model == model]
        return recs

    def path_of(self, site: str) -> str | None:
        with self._lock:
            rec = self._layers.get(site)
            return rec.path if rec else None

    def counts(self, model: str | None = None) -> dict[str, int]:
        counts = {p: 0 for p in PATHS}
        for rec in self.layers(model):
            counts[rec.path] += 1
        return counts

    def models(self) -> list[str]:
        return sorted({r.model for r in self.layers()})

    def clear(self, model: str | None = None) -> None:
        """Drop the records, standing notes and split hints of ``model``'s sites, or of every site."""
        with self._lock:
            if model is None:
                self._layers.clear()
                self._notes.clear()
                self._split_hints.clear()
            else:
                for site in [s for s, r in self._layers.items() if r.model == model]:
                    del self._layers[site]
                for site in [s for s in self._notes if s.split("/", 1)[0] == model and "/" in s]:
                    del self._notes[site]
                for site in [s for s in self._split_hints if s.split("/", 1)[0] == model and "/" in s]:
                    del self._split_hints[site]

    # -- timing ---------------------------------------------------------------------------
    def enable_timing(self, on: bool = True) -> None:
        self._timing = bool(on)

    @property
    def timing_enabled(self) -> bool:
        return self._timing

    def begin_run(self) -> None:
        with self._lock:
            self._events.clear()
            self._run_started = time.perf_counter()
            self._run_seq += 1

    def timed(self, path: str, device: torch.device):
        """Context manager timing one GEMM when timing is on and the device is CUDA."""
        return _Timed(self, path) if (self._timing and device.type == "cuda") else _NULL

    def end_run(self) -> dict[str, float] | None:
        """Synchronise and sum per-path GEMM time (ms) of the run since begin_run().

        A run without timed GEMMs (timing off, or GEMMs on the CPU) keeps the last timed result: ``last_run()``
        is always the last run that was timed."""
        with self._lock:
            events, self._events = self._events, []
            started, self._run_started = self._run_started, None
        if not events:
            return self._last_run_ms
        torch.cuda.synchronize()
        per_path: dict[str, float] = {p: 0.0 for p in PATHS}
        for path, start, stop in events:
            per_path[path] += start.elapsed_time(stop)
        self._last_run_ms = per_path
        self._last_run_wall_ms = (time.perf_counter() - started) * 1e3 if started is not None else None
        return self._last_run_ms

    def last_run(self) -> dict | None:
        if self._last_run_ms is None:
            return None
        return {"gemm_ms_per_path": dict(self._last_run_ms), "wall_ms": self._last_run_wall_ms}


class _Timed:
    def __init__(self, reg: GemmRegistry, path: str) -> None:
        self.reg, self.path = reg, path

    def __enter__(self):
        self.start = torch.cuda.Event(enable_timing=True)
        self.stop = torch.cuda.Event(enable_timing=True)
        self.start.record()
        return self

    def __exit__(self, *exc):
        self.stop.record()
        with self.reg._lock:
            self.reg._events.append((self.path, self.start, self.stop))
        return False


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()

REGISTRY = GemmRegistry()
