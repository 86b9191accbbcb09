"""Timing helpers shared by the benchmark and the diagnostics: GPU time with the host out of the
picture (CUDA-graph replay) and host time per call (the GPU never the limit)."""

from __future__ import annotations

import time

import torch


def graph_ms(variants: list, calls: int = 10, reps: int = 15) -> float:
    """Median GPU ms per call with the host out of the picture: ``calls`` calls (rotating over the
    operand sets) captured in one CUDA graph and replayed. Raises if a peer cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compiles, autotunes, allocates) outside the capture
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
    samples = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / calls)
    del graph
    return sorted(samples)[len(samples) // 2]


def host_us(fn, n: int = 300) -> float:
    """Host microseconds per call: ``n`` calls enqueued without synchronizing (use tiny operands)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def rank_interleaved(measures: dict, rounds: int = 5) -> list[tuple[float, str]]:
    """[(median ms, label)] fastest first, for ``measures`` {label: () -> ms}: every variant is measured
    once per round, so clock and thermal drift hit all alike (A/B scripts)."""
    times: dict[str, list[float]] = {label: [] for label in measures}
    for _ in range(rounds):
        for label, measure in measures.items():
            times[label].append(measure())
    return sorted((sorted(v)[len(v) // 2], label) for label, v in times.items())
