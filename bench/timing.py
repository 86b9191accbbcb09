"""Timing helpers shared by the benchmark and the diagnostics: GPU time with the host out of the
picture (CUDA-graph replay) and host time per call (the GPU never the limit)."""

from __future__ import annotations

import threading
import time

import torch


def capture_graph(variants: list, calls: int = 10) -> torch.cuda.CUDAGraph:
    """``calls`` calls (rotating over ``variants``) captured in one CUDA graph, replayed once. Every
    variant runs first on a side stream (compiles, autotunes, allocates outside the capture).
    Raises if a variant cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in variants:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            variants[i % len(variants)]()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _replay_ms(graph, reps: int = 1) -> float:
    """GPU ms of ``reps`` back-to-back replays of ``graph`` between two events."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def graph_ms(variants: list, calls: int = 10, reps: int = 15) -> float:
    """Median GPU ms per call with the host out of the picture: ``calls`` calls (rotating over the
    operand sets) captured in one CUDA graph and replayed. Raises if a peer cannot be captured."""
    graph = capture_graph(variants, calls)
    samples = sorted(_replay_ms(graph) / calls for _ in range(reps))
    del graph
    return samples[len(samples) // 2]


def _nvml_sm_mhz() -> float | None:
    try:
        return float(torch.cuda.clock_rate())  # NVML's current SM clock
    except Exception:  # no pynvml, or NVML refused
        return None


class ClockWatch:
    """The median NVML SM clock (MHz) and board power (W) while a ``with`` block runs, read every 20 ms by a thread
    (``sm_mhz``, ``watts``; None where NVML gives nothing), readings in the first ``skip_s`` left out (the clock is
    still leaving the previous window's state). Two runs of the same kernels at different clocks are not the same
    kernels' speed: a denser run (no host gaps, e.g. compiled) holds the board at its power limit. A thread reads
    while the block runs: the host's enqueueing blocks once the launch queue is full, so it cannot read afterwards."""

    def __init__(self, skip_s: float = 0.0) -> None:
        self.clocks: list[float] = []
        self.powers: list[float] = []
        self.sm_mhz = self.watts = None
        self.skip_s = skip_s
        self._done = threading.Event()

    def _poll(self) -> None:
        t0 = time.perf_counter()
        while not self._done.wait(0.02):
            if time.perf_counter() - t0 <= self.skip_s:
                continue
            mhz = _nvml_sm_mhz()
            if mhz is not None:
                self.clocks.append(mhz)
            try:
                self.powers.append(torch.cuda.power_draw() / 1e3)
            except Exception:  # no pynvml, or NVML refused
                pass

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
        self.sm_mhz, self.watts = med(self.clocks), med(self.powers)
        return False


def sustained_ms(variants: dict, seconds: float = 0.5, rounds: int = 3, calls: int = 10) -> dict:
    """{label: (median ms per call, median SM MHz)} under sustained load: each peer's ``calls``
    calls are captured in one CUDA graph, and in each round every peer (order rotating) replays
    its graph back to back for ~``seconds``. A diffusion sampler keeps the GPU busy for seconds, so
    the board sits at its power limit and the SM clock drops (H100 SXM at 700 W: ~1.3 GHz for a bf16
    GEMM, ~1.75 GHz for the W8A8 one); a burst timed from idle runs near the boost clock instead.
    The SM clock is the median of NVML readings taken every 20 ms during each window. A peer whose
    graph cannot be captured is left out (its label maps to its error string)."""
    graphs, out = {}, {}
    for label, fns in variants.items():
        try:
            g = capture_graph(fns, calls)
            graphs[label] = (g, max(1, int(seconds * 1e3 / max(_replay_ms(g), 1e-3))))
        except Exception as exc:
            torch.cuda.synchronize()
            out[label] = f"{exc.__class__.__name__}: {str(exc)[:160]}"
    samples = {label: ([], []) for label in graphs}
    labels = list(graphs)
    for r in range(rounds + 1):  # round 0 brings the board to its steady power state: not kept
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            g, reps = graphs[label]
            with ClockWatch(skip_s=0.05) as watch:
                ms = _replay_ms(g, reps)
            if r:
                samples[label][0].append(ms / (reps * calls))
                if watch.sm_mhz is not None:
                    samples[label][1].append(watch.sm_mhz)
    for label, (ms, mhz) in samples.items():
        out[label] = (sorted(ms)[len(ms) // 2], sorted(mhz)[len(mhz) // 2] if mhz else None)
    del graphs
    return out
