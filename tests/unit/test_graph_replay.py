"""A pass's CUDA graphs, CPU side: what a graph is keyed on (``graph_replay.signature``), that CPU passes never reach
a graph, and the bookkeeping that keeps graphs across runs (captured once per signature and weights, dropped when the
weights move, at most ``max_signatures`` per model, one pool per device released as a whole, its bytes reported). The
bookkeeping runs here on a stand-in for torch.cuda's graph calls; replays' results are checked on a GPU
(test_cuda_graphs_gpu.py)."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import graph_replay
from comfyui_ideogram4_int8.ideogram4.graph_replay import PassGraphs, signature


def test_signature_tells_apart_what_a_graph_cannot_serve():
    x = torch.randn(2, 8, 4)
    base = signature((x, torch.ones(1)), {"control": None})
    assert signature((torch.randn(2, 8, 4), torch.zeros(1)), {"control": None}) == base  # new values: same graph
    differs = [
        signature((torch.randn(2, 8, 5), torch.ones(1)), {"control": None}),  # shape
        signature((x.double(), torch.ones(1)), {"control": None}),  # dtype
        signature((x.transpose(0, 1).contiguous().transpose(0, 1), torch.ones(1)), {"control": None}),  # strides
        signature((x, None), {"control": None}),  # a tensor against None
        signature((x, torch.ones(1)), {"control": 3}),  # a plain value
        signature((x, torch.ones(1)), {"other": None}),  # a keyword
    ]
    assert all(d != base for d in differs) and len(set(differs)) == len(differs)
    with pytest.raises(TypeError, match="object"):
        signature((x, object()), {})


def test_passes_on_a_cpu_run_eagerly_and_keep_nothing():
    graphs = PassGraphs()
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    x = torch.randn(3)
    for _ in range(4):
        out, mode = graphs.run(fn, (x,), {})
        assert mode == "eager" and torch.equal(out, x + 1)
    assert len(calls) == 4 and graphs.stats.captures == 0 and not graphs._entries


class _FakeGraph:
    """torch.cuda.CUDAGraph's calls, counted; a capture 'reserves' ``grow`` bytes of the fake allocator."""

    grow = 3 << 20
    alive = 0
    capturing = False

    def __init__(self):
        self.replays = 0
        _FakeGraph.alive += 1

    def __del__(self):
        _FakeGraph.alive -= 1

    def capture_begin(self, pool=None, capture_error_mode=None):
        assert pool is not None  # every capture goes into its device's pool
        self.pool = pool
        _FakeGraph.capturing = True

    def capture_end(self):
        _FakeGraph.capturing = False
        _Alloc.reserved += _FakeGraph.grow

    def replay(self):
        self.replays += 1


class _Alloc:
    reserved = 0


@pytest.fixture
def fake_cuda(monkeypatch):
    """Passes on CPU tensors take the graph path, with torch.cuda's graph, stream and allocator calls stood in for."""
    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    monkeypatch.setattr(graph_replay, "_graph_device", lambda tensors: torch.device("cpu") if tensors else None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: _Alloc.reserved)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    pool = graph_replay.GraphPool(torch.device("cpu"))
    monkeypatch.setattr(graph_replay, "_POOLS", {torch.device("cpu"): pool})
    monkeypatch.setattr(graph_replay, "_LISTENERS", [])
    _Alloc.reserved = 0
    return pool


def _pass(graphs, x, fp=("w", 1)):
    return graphs.run(lambda x: x * 2, (x,), {}, fingerprint=fp)


def test_graphs_are_kept_across_runs_and_replay_from_the_first_pass(fake_cuda):
    graphs = PassGraphs()
    x = torch.randn(4, 8)
    modes = [_pass(graphs, torch.randn(4, 8))[1] for _ in range(4)]  # run 1
    assert modes == ["eager", "captured", "replayed", "replayed"]
    modes = [_pass(graphs, torch.randn(4, 8))[1] for _ in range(3)]  # run 2, same shapes and weights
    assert modes == ["replayed"] * 3 and graphs.stats.captures == 1
    out, _ = _pass(graphs, x)
    assert out.shape == x.shape and out is not graphs._entries[next(iter(graphs._entries))].output  # a copy
    # another pass (here: another rank): its own warm-up and capture, the first one kept
    assert [_pass(graphs, torch.randn(2, 8, 1))[1] for _ in range(3)] == ["eager", "captured", "replayed"]
    assert _pass(graphs, torch.randn(4, 8))[1] == "replayed" and graphs.graphs == 2 and graphs.stats.resized == 0


def test_moved_or_repatched_weights_drop_every_graph_of_the_model(fake_cuda):
    graphs = PassGraphs()
    for shape in ((4, 8), (2, 8, 1)):
        for _ in range(2):
            _pass(graphs, torch.randn(shape))
    assert graphs.graphs == 2
    # new addresses or a new patch set: nothing captured for the old ones may replay (they would read freed memory);
    # each signature warmed before is captured anew at its first call, with no eager pass
    captures = graphs.stats.captures
    assert _pass(graphs, torch.randn(4, 8), fp=("w", 2))[1] == "captured"
    assert graphs.graphs == 1 and graphs.stats.invalidations == 1 and graphs.stats.captures == captures + 1
    assert _pass(graphs, torch.randn(2, 8, 1), fp=("w", 2))[1] == "captured"  # the other signature: a capture too
    assert _pass(graphs, torch.randn(4, 8), fp=("w", 2))[1] == "replayed"
    assert graphs.stats.direct == 2 and graphs.stats.eager == 2  # the two first warm-ups only
    # another pass (here: another dtype), or the same one under another warm key (another streaming plan), warms up
    # first
    assert _pass(graphs, torch.randn(3, 8, dtype=torch.float64), fp=("w", 2))[1] == "eager"
    run = graphs.run
    assert run(lambda x: x * 2, (torch.randn(4, 8),), {}, fingerprint=("w", 3), warm_key="plan B")[1] == "eager"
    assert run(lambda x: x * 2, (torch.randn(4, 8),), {}, fingerprint=("w", 3), warm_key="plan B")[1] == "captured"
    # clear() (ComfyUI moved the weights) drops the graphs, not what the warm-ups did
    graphs.clear()
    assert run(lambda x: x * 2, (torch.randn(4, 8),), {}, fingerprint=("w", 4), warm_key="plan B")[1] == "captured"


def _ranked(rank: int) -> torch.Tensor:
    """A pass input of ``rank`` dimensions: a signature of a family of its own (no other rank shares it)."""
    return torch.randn(2, *([1] * (rank - 1)))


def test_at_most_max_signatures_graphs_per_model_least_recent_first(fake_cuda):
    graphs = PassGraphs(max_signatures=2)
    for rank in (1, 2, 3):
        for _ in range(2):
            _pass(graphs, _ranked(rank))
    assert graphs.graphs == 2 and graphs.stats.evictions == 1
    assert _pass(graphs, _ranked(3))[1] == "replayed"
    assert _pass(graphs, _ranked(2))[1] == "replayed"
    assert _pass(graphs, _ranked(1))[1] == "captured"  # evicted: captured again (its warm-up is done)
    assert graphs.graphs == 2 and graphs.stats.evictions == 2
    # what the warm-ups did is remembered for a bounded number of signatures and families too (4 × the graphs' bound)
    for rank in range(4, 14):
        for _ in range(2):
            _pass(graphs, _ranked(rank))
    assert len(graphs._warmed) == len(graphs._families) == 8 and _pass(graphs, _ranked(1))[1] == "eager"


def test_a_new_size_of_a_warmed_pass_is_captured_at_once(fake_cuda, monkeypatch):
    """A prompt of another length: the same pass at other sizes is captured at its first call, under the same warm
    key only; a capture that fails there (one-time work for its sizes) runs eagerly and captures at the next call."""
    monkeypatch.setattr(graph_replay, "_release_generator", lambda device: None)
    graphs = PassGraphs()
    assert [_pass(graphs, torch.randn(4, 8))[1] for _ in range(2)] == ["eager", "captured"]
    out, mode = _pass(graphs, x := torch.randn(5, 8))
    assert mode == "captured" and torch.equal(out, x * 2) and graphs.stats.resized == graphs.stats.direct == 1
    assert _pass(graphs, torch.randn(5, 8))[1] == "replayed" and graphs.stats.eager == 1
    # under another warm key (another streaming plan): warmed up first
    run = graphs.run
    assert run(lambda x: x * 2, (torch.randn(6, 8),), {}, fingerprint=("w", 1), warm_key="plan B")[1] == "eager"
    # a new size whose one-time work refuses the capture: eager once (no failure kept), then captured
    tuned = set()

    def first_use(x):
        if x.shape[0] not in tuned:
            if _FakeGraph.capturing:
                raise RuntimeError("autotuning GEMM at its first use, inside a CUDA graph capture")
            tuned.add(x.shape[0])
        return x * 2

    tuning = PassGraphs()
    assert [tuning.run(first_use, (torch.randn(4, 8),), {})[1] for _ in range(2)] == ["eager", "captured"]
    modes = [tuning.run(first_use, (torch.randn(7, 8),), {})[1] for _ in range(3)]
    assert modes == ["eager", "captured", "replayed"] and tuning.stats.failures == []
    assert tuning.stats.retried == ["RuntimeError: autotuning GEMM at its first use, inside a CUDA graph capture"]
    # the family stays: a size with its one-time work done is captured at once
    tuned.add(11)
    assert tuning.run(first_use, (torch.randn(11, 8),), {})[1] == "captured" and tuning.stats.resized == 1
    # a pass whose warm-up ran but whose capture never succeeded: its other sizes warm up first
    warmed_only = PassGraphs()
    assert warmed_only.run(lambda x: x * 2, (torch.randn(4, 8),), {})[1] == "eager"
    assert warmed_only.run(lambda x: x * 2, (torch.randn(5, 8),), {})[1] == "eager"


def test_a_family_is_the_signature_without_its_sizes():
    a = graph_replay._signature_of([torch.zeros(4, 8), 3, None], {"context": 1})
    b = graph_replay._signature_of([torch.zeros(5, 8), 3, None], {"context": 1})
    assert a != b and graph_replay._family_of(a) == graph_replay._family_of(b)
    for other in (
        [torch.zeros(4, 8, 1), 3, None],  # rank
        [torch.zeros(4, 8, dtype=torch.float64), 3, None],  # dtype
        [torch.zeros(4, 8), 4, None],  # a plain value
    ):
        assert graph_replay._family_of(graph_replay._signature_of(other, {"context": 1})) != graph_replay._family_of(a)
    assert graph_replay._family_of(graph_replay._signature_of([torch.zeros(4, 8), 3, None], {})) != (
        graph_replay._family_of(a)
    )  # the keyword names


def test_one_pool_per_device_released_as_a_whole_with_its_bytes_reported(fake_cuda):
    deltas = []
    graph_replay.on_pool_bytes(lambda device, delta: deltas.append(delta))
    cond, uncond = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    for model in (cond, uncond):
        for _ in range(2):
            _pass(graph_replay.graphs_of(model), torch.randn(4, 8))
    a, b = graph_replay.graphs_of(cond), graph_replay.graphs_of(uncond)
    assert a is graph_replay.graphs_of(cond)  # kept on the model
    assert a._pool is b._pool is fake_cuda and fake_cuda.bytes == 2 * _FakeGraph.grow
    assert deltas == [_FakeGraph.grow, _FakeGraph.grow]
    assert graph_replay.release_graphs_of(cond) == 2 * _FakeGraph.grow  # the branch sharing the pool goes too
    assert a.graphs == 0 and b.graphs == 0 and fake_cuda.bytes == 0 and deltas[-1] == -2 * _FakeGraph.grow
    assert _FakeGraph.alive == 0  # nothing holds a graph (its memory returns to the allocator)
    assert graph_replay.release_graphs_of(cond) == 0 and len(deltas) == 3  # nothing left: nothing reported
    assert graph_replay.release_graphs_of(torch.nn.Linear(2, 2)) == 0  # a model that never captured
    handles = []
    real = torch.cuda.graph_pool_handle
    torch.cuda.graph_pool_handle = lambda: handles.append(object()) or handles[-1]
    try:
        # released (ComfyUI moved the weights): the warmed signature is captured again at its next call
        assert [_pass(b, torch.randn(4, 8))[1] for _ in range(2)] == ["captured", "replayed"] and len(handles) == 1
        # the graphs of one model dropped (its weights moved) with none left in the pool: the pool starts anew (a
        # new handle) with the recapture
        assert _pass(b, torch.randn(4, 8), fp=("w", 9))[1] == "captured" and fake_cuda.live == 1
        assert deltas[-2:] == [-_FakeGraph.grow, _FakeGraph.grow] and len(handles) == 2
    finally:
        torch.cuda.graph_pool_handle = real


def test_a_failed_capture_leaves_its_signature_eager_with_the_reason(fake_cuda, monkeypatch):
    monkeypatch.setattr(graph_replay, "_release_generator", lambda device: None)
    graphs = PassGraphs()

    def syncs(x):
        if _FakeGraph.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        return x

    handles = []
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: handles.append(object()) or handles[-1])
    x = torch.randn(3)
    modes = [graphs.run(syncs, (x,), {}, fingerprint=())[1] for _ in range(3)]
    assert modes == ["eager"] * 3 and graphs.graphs == 0
    assert graphs.stats.failures == ["RuntimeError: operation not permitted when stream is capturing"]
    assert fake_cuda.bytes == 0
    # no graph of the pool alive: the next capture (another model's) starts a new pool, not the failed one's
    other = PassGraphs()
    assert [other.run(lambda x: x + 1, (x,), {})[1] for _ in range(2)] == ["eager", "captured"]
    assert len(handles) == 2 and other.graphs == 1
    # with a graph of the pool alive, a failed capture leaves the pool as it is (that graph holds it): the next
    # capture joins the same pool
    failing = PassGraphs()
    assert [failing.run(syncs, (x,), {})[1] for _ in range(2)] == ["eager", "eager"] and failing.stats.failures
    y = torch.randn(5, 1)  # another pass (another rank): a warm-up, then its capture
    assert [other.run(lambda x: x + 1, (y,), {})[1] for _ in range(2)] == ["eager", "captured"]
    assert len(handles) == 2 and other.graphs == 2


def test_a_direct_capture_that_fails_warms_up_once_and_captures_again(fake_cuda, monkeypatch):
    monkeypatch.setattr(graph_replay, "_release_generator", lambda device: None)
    graphs = PassGraphs()
    lazy = {"pending": False}  # something the pass does once after the weights moved, and which a capture refuses

    def fn(x):
        if lazy["pending"] and _FakeGraph.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        lazy["pending"] = False
        return x * 3

    x = torch.randn(3)
    assert [graphs.run(fn, (x,), {}, fingerprint=1)[1] for _ in range(2)] == ["eager", "captured"]
    lazy["pending"] = True  # the weights moved, and the next pass has its one-time work to do
    modes = [graphs.run(fn, (x,), {}, fingerprint=2) for _ in range(3)]
    assert [m for _, m in modes] == ["eager", "captured", "replayed"]
    assert all(torch.equal(out, x * 3) for out, _ in modes)
    assert graphs.stats.retried == ["RuntimeError: operation not permitted when stream is capturing"]
    assert graphs.stats.failures == [] and graphs.stats.direct == 0 and graphs.graphs == 1
    # a pass that can never be captured: its failure after a warm-up is final, and it is not taken as warmed
    never = PassGraphs()

    def syncs(x):
        if _FakeGraph.capturing:
            raise RuntimeError("a host sync")
        return x

    assert [never.run(syncs, (x,), {}, fingerprint=1)[1] for _ in range(3)] == ["eager"] * 3
    assert [never.run(syncs, (x,), {}, fingerprint=2)[1] for _ in range(3)] == ["eager"] * 3
    assert never.stats.failures == ["RuntimeError: a host sync"] * 2 and never.stats.retried == []
