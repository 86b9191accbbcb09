"""CUDA graphs of a model's forward pass: captured once per input signature, replayed across sampling runs.

A pass launches about 1700 kernels from Python; a replayed graph launches the whole pass in one call, so the host's
share of a pass drops to the input copies and the replay.

``PassGraphs`` holds one model's graphs. Per input signature (shapes, dtypes, strides and devices of the tensor
arguments, the values of the others): the first ``warmup`` calls run eagerly (autotuning and compilation happen
there: nothing may benchmark during a capture), the next one captures the pass on static copies of its inputs and
replays it, and every later call, in this run or a later one, copies its inputs into those copies and replays. The
graphs stay valid while the weights stay where they were captured: the caller's ``fingerprint`` (the weights'
addresses and their patch set) is compared at every call, and a new fingerprint drops every graph of the model
before anything runs (a graph would read freed or re-patched memory). At most ``max_signatures`` signatures keep a
graph (the least recently used goes first). A capture that fails after a warm-up (an operation that cannot be
captured, such as a host sync) leaves that signature eager, with the reason kept for the panel. The output returned
is a copy: the graph's own output is overwritten by its next replay.

What the warm-up did (autotuning, compilation) outlives the weights' addresses: a signature warmed once, with the
same ``warm_key`` (the caller's name for how the pass runs: its streaming plan), is captured at its first call after
a new fingerprint, with no eager pass (a prompt change that moved the weights pays one capture per branch, not an
eager pass and a capture). So is a signature that differs from a captured one only in its sizes (a prompt of
another length); what its sizes need once refuses to run inside a capture (``kernels.capture_guard``). Should such
a capture fail, the call runs eagerly and the next one captures; only a capture after a warm-up fails for good.

``GraphPool``: the graphs of every model on one device share one memory pool (the two branches' passes run one after
the other there). ``release()`` drops every graph in it and hands its memory back to the caching allocator; the
pool's bytes (the memory its captures reserved) are reported to listeners (``on_pool_bytes``), so a model manager can
count them as used. Torch only (no ComfyUI): ``nodes/runtime/cuda_graphs.py`` decides when a MODEL's passes use graphs
and releases the pool when ComfyUI moves the weights.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

WARMUP_CALLS = 1
MAX_SIGNATURES = 4  # resolutions / batch sizes per model whose graphs are kept (each holds its own static inputs)
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


def signature(args: tuple, kwargs: dict) -> tuple:
    """What a graph is valid for: each tensor's shape, stride, dtype and device, every other value as it is."""
    leaves: list = []
    _leaves((args, kwargs), leaves)
    return _signature_of(leaves, kwargs)


def _signature_of(leaves: list, kwargs: dict) -> tuple:
    sig = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            sig.append(("T", tuple(v.shape), v.stride(), v.dtype, v.device))
        elif v is None or isinstance(v, (bool, int, float, str)):
            sig.append(v)
        else:
            raise TypeError(f"a graph input of type {type(v).__name__} has no signature")
    return (tuple(sig), tuple(sorted(map(str, kwargs))))


def _family_of(signature: tuple) -> tuple:
    """``signature`` without its tensors' sizes and strides: the signatures of one pass at other sizes share it."""
    leaves, names = signature
    return tuple(("T", len(v[1]), v[3], v[4]) if isinstance(v, tuple) and v[:1] == ("T",) else v for v in leaves), names


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
    an invalidated capture every later random op on the device raised "Offset increment outside graph capture
    encountered unexpectedly" (the next sampler's noise, in ComfyUI). A trivial capture that ends properly takes it
    out."""
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


def _graph_device(tensors: list) -> torch.device | None:
    """The CUDA device of a pass's inputs, or None (no graph: the pass runs as it is)."""
    return next((t.device for t in tensors if t.device.type == "cuda"), None)


_LISTENERS: list[Callable[[torch.device, int], None]] = []


def on_pool_bytes(listener: Callable[[torch.device, int], None]) -> None:
    """Call ``listener(device, delta)`` whenever a pool's bytes change (capture: +, release: -). Added once."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


class GraphPool:
    """The memory pool that every graph on one device captures into, and the models (``PassGraphs``) using it."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self._handle = None
        self._members: weakref.WeakSet = weakref.WeakSet()
        self.bytes = 0  # what captures into this pool reserved (the allocator's growth across each capture)
        self.live = 0  # graphs captured into it and not dropped
        self.releases = 0
        self._lock = threading.Lock()

    def handle(self):
        with self._lock:
            if self._handle is None:
                self._handle = torch.cuda.graph_pool_handle()
            return self._handle

    def join(self, graphs: PassGraphs) -> None:
        self._members.add(graphs)

    def captured(self, nbytes: int) -> None:
        """A graph was captured into the pool; the allocator grew by ``nbytes`` across the capture."""
        with self._lock:
            self.live += 1
            self.bytes += nbytes
        if nbytes:
            for fn in list(_LISTENERS):
                fn(self.device, nbytes)

    def dropped(self, graphs: int) -> None:
        """``graphs`` of its graphs were dropped. Once none is left the pool's memory is free and the pool starts anew
        at the next capture (a capture into a pool whose every graph is gone failed on a GPU)."""
        with self._lock:
            self.live = max(0, self.live - graphs)
            freed = self.bytes if self.live == 0 else 0
            if self.live == 0:
                self.bytes, self._handle = 0, None
                self.releases += 1 if freed else 0
        if freed:
            for fn in list(_LISTENERS):
                fn(self.device, -freed)

    def failed(self) -> None:
        """A capture into the pool failed. With no graph of it alive, the pool starts anew at the next capture: the
        failed capture's pool is gone while the allocator still knows its id, and a capture into it raised
        "use_count > 0 INTERNAL ASSERT FAILED"."""
        with self._lock:
            if self.live == 0:
                self._handle = None

    def release(self) -> int:
        """Drop every graph captured into this pool (each model captures again at its next pass); returns the bytes
        its captures had reserved, which go back to the caching allocator (and to the card at its next
        ``empty_cache``)."""
        freed = self.bytes
        for member in list(self._members):
            member.clear()
        with self._lock:  # members' graphs all dropped: ``dropped`` emptied the pool
            self.live, self._handle = 0, None
        return freed


_POOLS: dict[torch.device, GraphPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(device) -> GraphPool:
    """The one pool of ``device``."""
    device = torch.device(device)
    with _POOLS_LOCK:
        if device not in _POOLS:
            _POOLS[device] = GraphPool(device)
        return _POOLS[device]


MODEL_ATTR = "ideogram4_graphs"  # where a model keeps its PassGraphs between runs


def graphs_of(model: torch.nn.Module) -> PassGraphs:
    """The graphs ``model`` keeps across runs (made at first use)."""
    graphs = getattr(model, MODEL_ATTR, None)
    if graphs is None:
        graphs = PassGraphs()
        setattr(model, MODEL_ATTR, graphs)
    return graphs


def release_graphs_of(model) -> int:
    """Drop ``model``'s graphs and those of every model sharing their pool (the weights are about to move: a graph
    would read them where they were); returns the bytes the pool's captures had reserved."""
    graphs = getattr(model, MODEL_ATTR, None)
    if graphs is None:
        return 0
    if graphs._pool is not None:
        return graphs._pool.release()
    graphs.clear()
    return 0


@dataclass
class _Entry:
    calls: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    inputs: list = field(default_factory=list)  # the static input tensors, in _leaves order
    output: object = None
    failed: str | None = None
    direct: bool = False  # its next capture comes with no warm-up under this fingerprint (warmed under another)
    resized: bool = False  # ... nor ever (the same pass at other sizes was warmed)


@dataclass
class GraphStats:
    captures: int = 0
    replays: int = 0
    eager: int = 0
    invalidations: int = 0  # times the fingerprint changed with graphs held (weights moved or were re-patched)
    evictions: int = 0  # graphs dropped for the signature bound
    direct: int = 0  # captures with no eager pass before them (signatures warmed under an earlier fingerprint)
    resized: int = 0  # of those, signatures never warmed whose family (the same pass at other sizes) was
    failures: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)  # direct captures that failed: eager once, then a capture again


class PassGraphs:
    """One model's graphs (module docstring). Thread-safe: two cards capture and replay from two threads, each
    under its own device."""

    def __init__(self, warmup: int = WARMUP_CALLS, max_signatures: int = MAX_SIGNATURES) -> None:
        self.warmup = warmup
        self.max_signatures = max(1, int(max_signatures))
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._fingerprint: object = None
        # (signature, warm key) whose warm-up ran, across fingerprints; bounded as the graphs are, a few times over;
        # and the same for their families (_family_of)
        self._warmed: OrderedDict[tuple, None] = OrderedDict()
        self._families: OrderedDict[tuple, None] = OrderedDict()
        self._pool: GraphPool | None = None  # its device's pool, from the first capture on
        self._lock = threading.Lock()
        self.stats = GraphStats()

    @property
    def pool(self) -> GraphPool | None:
        """The pool of the device this model captured on (None before its first capture)."""
        return self._pool

    @property
    def graphs(self) -> int:
        """Graphs held now."""
        return sum(1 for e in self._entries.values() if e.graph is not None)

    def run(self, fn: Callable, args: tuple, kwargs: dict, fingerprint=(), warm_key=None) -> tuple[object, str]:
        """(``fn(*args, **kwargs)``, how it ran: "eager", "captured" or "replayed"). A replay runs the captured
        kernels on the new inputs: its result equals the eager one. No Python of ``fn`` runs in a replay.
        ``warm_key`` (hashable): how the pass runs beyond its inputs; a warm-up counts for the same key only."""
        leaves: list = []  # one walk of the inputs per pass: the tensors and the key come from it
        _leaves((args, kwargs), leaves)
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        device = _graph_device(tensors)
        if device is None:
            return fn(*args, **kwargs), "eager"
        key = _signature_of(leaves, kwargs)
        warm = (key, warm_key)
        with self._lock:
            if fingerprint != self._fingerprint:
                if self._entries:
                    self.stats.invalidations += 1
                self._clear_locked()
                self._fingerprint = fingerprint
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry()
                resized = warm not in self._warmed and (_family_of(key), warm_key) in self._families
                if self.warmup > 0 and (warm in self._warmed or resized):  # captured at once (module docstring)
                    entry.calls, entry.direct, entry.resized = self.warmup, True, resized
                self._evict_locked()
            self._entries.move_to_end(key)
            entry.calls += 1
            calls = entry.calls
        if entry.failed is not None or calls <= self.warmup:
            self.stats.eager += 1
            out = fn(*args, **kwargs)
            if entry.failed is None and calls >= self.warmup:
                self._mark_warmed(warm)
            return out, "eager"
        with torch.cuda.device(device):
            if entry.graph is None:
                return self._capture(entry, warm, device, fn, args, kwargs, tensors)
            for s, t in zip(entry.inputs, tensors, strict=True):
                if s.data_ptr() != t.data_ptr():
                    s.copy_(t)
            entry.graph.replay()
            self.stats.replays += 1
            return _copy_out(entry.output), "replayed"

    def _mark_warmed(self, warm: tuple, done: bool = True, captured: bool = False) -> None:
        """``warm`` (signature, warm key) finished its warm-up (``done``), or its capture failed (not warmed);
        ``captured``: its capture succeeded, so its family (the same pass at other sizes) is captured at once too.
        A family stays after a failed capture of one of its sizes: a failure there costs one eager pass."""
        with self._lock:
            if not done:
                self._warmed.pop(warm, None)
                return
            marks = [(self._warmed, warm)]
            if captured:
                marks.append((self._families, (_family_of(warm[0]), warm[1])))
            for seen, item in marks:
                seen[item] = None
                seen.move_to_end(item)
                while len(seen) > 4 * self.max_signatures:
                    seen.popitem(last=False)

    def _evict_locked(self) -> None:
        while len(self._entries) > self.max_signatures:
            _, old = self._entries.popitem(last=False)
            if old.graph is not None:
                self.stats.evictions += 1
                old.graph = None
                if self._pool is not None:
                    self._pool.dropped(1)

    def _clear_locked(self) -> None:
        held = self.graphs
        self._entries.clear()
        if held and self._pool is not None:
            self._pool.dropped(held)

    def _pool_of(self, device) -> GraphPool:
        if self._pool is None:
            self._pool = pool_for(device)
        self._pool.join(self)
        return self._pool

    def _capture(self, entry: _Entry, warm: tuple, device, fn, args, kwargs, tensors):
        statics = [_static_copy(t) for t in tensors]
        s_args, s_kwargs = _rebuild((args, kwargs), list(statics))
        graph = torch.cuda.CUDAGraph()
        main = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        pool = self._pool_of(device)
        reason = None
        try:
            # One capture at a time in the process (torch.cuda.graph() is not used: nothing would stop the other
            # card's thread from capturing while this one empties the caches); thread_local: that thread may launch
            # or allocate meanwhile. The cache is emptied so the graph's pool can take what the eager passes held,
            # and the allocator's growth across the capture is what the pool took.
            with _CAPTURE_LOCK:
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                before = torch.cuda.memory_reserved(device)
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    graph.capture_begin(pool=pool.handle(), capture_error_mode="thread_local")
                    try:
                        out = fn(*s_args, **s_kwargs)
                    finally:
                        graph.capture_end()
                main.wait_stream(side)
                grown = max(0, torch.cuda.memory_reserved(device) - before)
            _check_output(out)  # before it is kept: a replay hands back a copy of it
        except Exception as exc:  # noqa: BLE001 - any capture failure leaves this signature eager, labelled
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        if reason is not None:  # out of the handler: its traceback no longer holds the capture's tensors
            self._mark_warmed(warm, done=False)
            if entry.direct:  # no warm-up under these weights: this call warms up, the next one captures again
                entry.direct = entry.resized = False
                self.stats.retried.append(reason)
            else:
                entry.failed = reason
                self.stats.failures.append(reason)
            del graph, s_args, s_kwargs, statics
            out = None  # a pass that returned before its check failed: its output is the capture's memory too
            pool.failed()
            torch.cuda.synchronize(device)
            _release_generator(device)
            self.stats.eager += 1
            return fn(*args, **kwargs), "eager"
        entry.graph, entry.inputs, entry.output = graph, statics, out
        pool.captured(grown)
        self.stats.captures += 1
        self.stats.direct += entry.direct
        self.stats.resized += entry.resized
        entry.direct = entry.resized = False
        self._mark_warmed(warm, captured=True)
        graph.replay()  # the capture recorded the pass without running it
        self.stats.replays += 1
        return _copy_out(out), "captured"

    def clear(self) -> None:
        """Drop every graph (a warmed signature is captured again at its next call, any other after its warm-up);
        their memory goes back to the caching allocator once no graph of the pool is left."""
        with self._lock:
            self._clear_locked()
            self._fingerprint = None


__all__ = [
    "PassGraphs",
    "GraphPool",
    "GraphStats",
    "signature",
    "pool_for",
    "graphs_of",
    "release_graphs_of",
    "MODEL_ATTR",
    "on_pool_bytes",
    "WARMUP_CALLS",
    "MAX_SIGNATURES",
]
