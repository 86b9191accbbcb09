"""CUDA graphs of a model's forward pass: capture once per input signature, then replay.

Why: a pass of Ideogram 4 at 1024² launches ~1700 kernels from Python; measured on an H200 through ComfyUI, the
host spends ~70 ms per pass against ~100 ms of GPU time. One card hides that, but two passes on two cards (one
branch each) take turns on one interpreter and the step stays host-bound. A replayed graph launches the whole pass
in one call, so the host time of a pass drops to the input copies and the replay.

``PassGraphs`` holds the graphs of one sampling run. Per input signature (shapes, dtypes, strides and devices of the
tensor arguments, the values of the others): the first ``warmup`` calls run eagerly (the kernels' autotuning and
compilation happen there: nothing may benchmark during capture), the next one captures the pass into a graph on
static copies of its inputs and replays it, and later calls copy their inputs into those copies and replay. The
caller's ``fingerprint`` (e.g. the data pointers of the weights) is part of the signature: weights that moved get a
new capture. A capture that fails (an operation that cannot be captured, such as a host sync) leaves that signature
eager for the rest of the run, with the reason kept for the panel. The output returned is a copy: the graph's own
output is overwritten by its next replay, and graphs of one device share one memory pool.

Torch only (no ComfyUI): the ComfyUI wrapper that decides when a MODEL may use it is ``nodes/cuda_graphs.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

WARMUP_CALLS = 1
_CAPTURE_LOCK = threading.Lock()


def _leaves(obj, out: list) -> None:
    if isinstance(obj, (list, tuple)):
        for o in obj:
            _leaves(o, out)
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _leaves(obj[k], out)
    else:
        out.append(obj)


def signature(args: tuple, kwargs: dict, fingerprint=()) -> tuple:
    """What a graph is valid for: each tensor's shape, stride, dtype and device, every other value as it is."""
    leaves: list = []
    _leaves((args, kwargs), leaves)
    return _signature_of(leaves, kwargs, fingerprint)


def _signature_of(leaves: list, kwargs: dict, fingerprint) -> tuple:
    sig = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            sig.append(("T", tuple(v.shape), v.stride(), v.dtype, v.device))
        elif v is None or isinstance(v, (bool, int, float, str)):
            sig.append(v)
        else:
            raise TypeError(f"a graph input of type {type(v).__name__} has no signature")
    return (tuple(sig), fingerprint, tuple(sorted(map(str, kwargs))))


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    s = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    s.copy_(t)
    return s


def _rebuild(obj, tensors: list):
    """``obj`` with its tensors replaced, in ``_leaves`` order, by ``tensors`` (consumed from the front)."""
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rebuild(o, tensors) for o in obj)
    if isinstance(obj, dict):
        return {k: _rebuild(obj[k], tensors) for k in sorted(obj, key=str)}
    if isinstance(obj, torch.Tensor):
        return tensors.pop(0)
    return obj


def _check_output(out) -> None:
    if isinstance(out, (list, tuple)):
        for o in out:
            _check_output(o)
    elif not isinstance(out, torch.Tensor):
        raise TypeError(f"a graph's output must be tensors, got {type(out).__name__}")


def _copy_out(out):
    """A copy of the graph's output (checked by ``_check_output`` at capture)."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    return type(out)(_copy_out(o) for o in out)


def _release_generator(device) -> None:
    """Take the device's default random generator out of capture mode after a capture that failed.

    ``capture_begin`` puts the generator in capture mode and only a ``capture_end`` that succeeds takes it out: after
    an invalidated capture (a host sync in the pass) every later random op on the device raised "Offset increment
    outside graph capture encountered unexpectedly" (H100, torch 2.11: the next GPU tests' ``torch.rand``; in ComfyUI,
    the next sampler's noise). A trivial capture that ends properly takes it out."""
    scratch = torch.zeros(1, device=device)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            scratch.add_(1)
        finally:
            graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(side)
    del graph


@dataclass
class _Entry:
    calls: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    inputs: list = field(default_factory=list)  # the static input tensors, in _leaves order
    output: object = None
    failed: str | None = None


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager: int = 0
    failures: list[str] = field(default_factory=list)


class PassGraphs:
    """The graphs of one sampling run (see the module docstring). Thread-safe per device: two cards capture and
    replay from two threads, each under its own device."""

    def __init__(self, warmup: int = WARMUP_CALLS, pools: dict | None = None) -> None:
        self.warmup = warmup
        self._entries: dict[tuple, _Entry] = {}
        # one memory pool per device, shareable by the graphs of passes that run one after the other on it
        self._pools: dict[torch.device, object] = {} if pools is None else pools
        self._lock = threading.Lock()
        self.stats = GraphStats()

    def run(self, fn: Callable, args: tuple, kwargs: dict, fingerprint=()) -> tuple[object, str]:
        """(``fn(*args, **kwargs)``, how it ran: "eager", "captured" or "replayed"). A replay runs the captured
        kernels on the new inputs: its result equals the eager one. No Python of ``fn`` runs in a replay."""
        leaves: list = []  # one walk of the inputs per pass: the tensors and the key come from it
        _leaves((args, kwargs), leaves)
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        device = next((t.device for t in tensors if t.device.type == "cuda"), None)
        if device is None:
            return fn(*args, **kwargs), "eager"
        key = _signature_of(leaves, kwargs, fingerprint)
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            entry.calls += 1
            calls = entry.calls
        if entry.failed is not None or calls <= self.warmup:
            self.stats.eager += 1
            return fn(*args, **kwargs), "eager"
        with torch.cuda.device(device):
            if entry.graph is None:
                return self._capture(entry, device, fn, args, kwargs, tensors)
            for s, t in zip(entry.inputs, tensors, strict=True):
                if s.data_ptr() != t.data_ptr():
                    s.copy_(t)
            entry.graph.replay()
            self.stats.replays += 1
            return _copy_out(entry.output), "replayed"

    def _pool(self, device: torch.device):
        with self._lock:
            if device not in self._pools:
                self._pools[device] = torch.cuda.graph_pool_handle()
            return self._pools[device]

    def _capture(self, entry: _Entry, device, fn, args, kwargs, tensors):
        statics = [_static_copy(t) for t in tensors]
        s_args, s_kwargs = _rebuild((args, kwargs), list(statics))
        graph = torch.cuda.CUDAGraph()
        main = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        try:
            # One capture at a time in the process (torch.cuda.graph() is not used: nothing would stop the other
            # card's thread from capturing while this one empties the caches); thread_local: that thread may launch
            # or allocate meanwhile. The cache is emptied so the graph's pool can take what the eager passes held.
            with _CAPTURE_LOCK:
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    graph.capture_begin(pool=self._pool(device), capture_error_mode="thread_local")
                    try:
                        out = fn(*s_args, **s_kwargs)
                    finally:
                        graph.capture_end()
                main.wait_stream(side)
            _check_output(out)  # before it is kept: a replay hands back a copy of it
        except Exception as exc:  # noqa: BLE001 - any capture failure leaves this signature eager, labelled
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            entry.failed = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            self.stats.failures.append(entry.failed)
            del graph
            torch.cuda.synchronize(device)
            _release_generator(device)
            self.stats.eager += 1
            return fn(*args, **kwargs), "eager"
        entry.graph, entry.inputs, entry.output = graph, statics, out
        self.stats.captures += 1
        graph.replay()  # the capture recorded the pass without running it
        self.stats.replays += 1
        return _copy_out(out), "captured"

    def close(self) -> None:
        """Drop every graph; its memory goes back to the caching allocator once no graph of its pool is left."""
        with self._lock:
            self._entries.clear()


__all__ = ["PassGraphs", "GraphStats", "signature", "WARMUP_CALLS"]
