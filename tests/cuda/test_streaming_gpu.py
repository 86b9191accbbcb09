"""Low-VRAM streaming on a GPU (cuda): int8 weights streamed from pinned memory as pieces of blocks (attention, the
w1|w3 pair, w2), or as whole blocks, through the fused kernels equal the resident run bit for bit; the registry
records the fused paths on the streamed layers (the pair as one GEMM: w1 and w3 carry no hooks); the copies run on a
stream of their own, overlapping the GEMMs (read from the profiler's per-stream order, not from a timing bound); the
per-piece timing events reach the stream's statistics; a streamed forward captured as a CUDA graph replays its
copies."""

from __future__ import annotations

import os

import pytest
import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4 import streaming
from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_forward
from comfyui_ideogram4_int8.kernels.gate_up import FUSION_ONE_GEMM

pytestmark = pytest.mark.cuda
K, F = 4608, 12288  # Ideogram 4's width and FFN width: qkv [3K, K], o [K, K], w1 / w3 [F, K], w2 [K, F]


class _Linear(torch.nn.Module):
    """A W8A8 linear: int8 weight [n, k] with an outlier input channel, per-row scale, its own registry site."""

    def __init__(self, n, k, site, g):
        super().__init__()
        w = torch.randn(n, k, generator=g, device="cuda") / k**0.5  # unit-scale outputs: no overflow over the depth
        w[:, 7] *= 30
        self.register_buffer("scale", w.abs().amax(1) / 127)
        self.weight = torch.nn.Parameter((w / self.scale[:, None]).round().clamp(-127, 127).to(torch.int8), False)
        self.site = site

    def forward(self, x):
        return w8a8_forward(x, self.weight, self.scale, site=self.site)


class _Attention(torch.nn.Module):
    def __init__(self, index, g):
        super().__init__()
        self.qkv = _Linear(3 * K, K, f"stream/b{index}.qkv", g)
        self.o = _Linear(K, K, f"stream/b{index}.o", g)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.o(q * torch.sigmoid(k) + v)


class _FeedForward(torch.nn.Module):
    """w2(silu(w1 x) * w3 x) with w1|w3 as one fused pair call reading both weights in place
    (nodes/runtime/ffn_fusion.py)."""

    def __init__(self, index, g):
        super().__init__()
        self.w1 = _Linear(F, K, f"stream/b{index}.w1", g)
        self.w2 = _Linear(K, F, f"stream/b{index}.w2", g)
        self.w3 = _Linear(F, K, f"stream/b{index}.w3", g)

    def forward(self, x):
        w1, w3 = self.w1, self.w3
        h = kernels.swiglu_w8a8_pair(x, w1.weight, w1.scale, w3.weight, w3.scale, site=(w1.site, w3.site))
        return self.w2(h)


class _Block(torch.nn.Module):
    """Attention then FFN, the order of ComfyUI's Ideogram4TransformerBlock (normalized inputs, as there: the
    SwiGLU is quadratic, unnormalized activations would overflow over the depth; no modulation)."""

    def __init__(self, index, g):
        super().__init__()
        self.attention = _Attention(index, g)
        self.feed_forward = _FeedForward(index, g)

    def forward(self, x):
        x = x + self.attention(torch.nn.functional.rms_norm(x, (K,)))
        return x + self.feed_forward(torch.nn.functional.rms_norm(x, (K,)))


def _empty():
    return torch.nn.Parameter(torch.empty(0, dtype=torch.int8, device="cuda"), False)


def _unit(index, piece):
    """The piece's weights to pinned host memory (their device copies go: what streaming saves); unbound, the
    modules hold empty weights, so a kernel that ran on an unbound piece would fail."""
    mods = [m for _, m in piece.modules]
    host = [m.weight.detach().cpu().pin_memory() for m in mods]
    for m in mods:
        m.weight = _empty()

    def bind(views, mods=mods):
        for m, v in zip(mods, views, strict=True):
            m._parameters["weight"] = torch.nn.Parameter(v, False)

    def unbind(mods=mods):
        for m in mods:
            m._parameters["weight"] = _empty()

    return streaming.StreamUnit(index, host, bind, unbind, [True] * len(host), piece.name)


def _stream(blocks, streamed, split):
    pieces = {}
    for i in streamed:
        linears = [(n, m) for n, m in blocks[i].named_modules() if isinstance(m, _Linear)]
        pieces[i] = streaming.block_pieces(blocks[i], linears, split)
    units = [_unit(i, p) for i in streamed for p in pieces[i]]
    s = streaming.BlockStreamer(units, torch.device("cuda"), 3 if split else 2, max(u.nbytes for u in units))
    for i in streamed:
        streaming.hook_pieces(s, i, pieces[i])
    return s


@pytest.mark.parametrize("split", [True, False], ids=["pieces", "whole-blocks"])
def test_streamed_int8_blocks_equal_resident_and_copies_overlap_compute(split):
    seed = int.from_bytes(os.urandom(3), "little")
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = torch.nn.Sequential(*[_Block(i, g) for i in range(8)])
    x = torch.randn(4608, K, generator=g, device="cuda").bfloat16()
    with torch.no_grad():
        want = blocks(x)
    streamed = streaming.spread(4, 8)
    s = _stream(blocks, streamed, split)
    keys = [u.key for u in s.units]
    if split:  # three pieces per block, slots of the largest (the pair: 2 F K bytes) instead of a whole block
        assert keys == [(i, p) for i in streamed for p in ("attention", "gate_up", "down")]
        assert s.slot_bytes == streaming.aligned(2 * F * K) and len(s.buffers) == 3
    else:
        assert keys == [(i, streaming.WHOLE) for i in streamed] and len(s.buffers) == 2
        assert s.slot_bytes == (3 * K * K + K * K + 3 * F * K)
    # the pair stays one fused call: hooks on w1 / w3 would make nodes/runtime/ffn_fusion.py split it
    for i in streamed:
        ff = blocks[i].feed_forward
        assert not (
            ff.w1._forward_pre_hooks or ff.w1._forward_hooks or ff.w3._forward_pre_hooks or ff.w3._forward_hooks
        )
    kernels.REGISTRY.clear()
    with torch.no_grad():
        blocks(x)  # first forward queues the later ones
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            outs = [blocks(x) for _ in range(2)]
            torch.cuda.synchronize()
        blocks(x)  # closes the measurement of the synchronized forwards (their events are read one forward later)
    for out in outs:
        assert torch.equal(out, want), f"seed {seed}"
    records = {r.layer: r for r in kernels.REGISTRY.layers("stream")}
    for i in streamed:
        for name in ("qkv", "o", "w1", "w3", "w2"):
            assert records[f"b{i}.{name}"].path == "triton-int8", (name, records[f"b{i}.{name}"])
        assert records[f"b{i}.w1"].fusion == records[f"b{i}.w3"].fusion == FUSION_ONE_GEMM
    assert s.stats.mispredicted == 0
    # the per-piece copy and wait events reached the statistics (values, not a timing bound)
    assert s.stats.forwards >= 1 and s.stats.copy_ms > 0 and s.stats.hidden is not None, s.stats
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = [e for e in events if "HtoD" in e.name]
    kernels_ = [e for e in events if "Memcpy" not in e.name and "Memset" not in e.name]
    tensors = sum(len(u.host) for u in s.units)
    assert len(copies) >= 2 * tensors, [e.name for e in events][:20]

    def stream_of(e):
        return getattr(e, "device_resource_id", None)

    copy_streams = {stream_of(e) for e in copies}
    kernel_streams = {stream_of(e) for e in kernels_}
    assert copy_streams.isdisjoint(kernel_streams), (copy_streams, kernel_streams)

    # overlap: some copy interval intersects some kernel interval (stream order, not a duration bound)
    def span(e):
        return e.time_range.start, e.time_range.end

    overlapping = sum(1 for c in copies for k in kernels_ if span(c)[0] < span(k)[1] and span(k)[0] < span(c)[1])
    assert overlapping > 0
    s.drain()


def _passes(graphs, blocks, streamer, x0, want, seed, streamed) -> list[str]:
    """How each of ``len(want)`` passes of ``blocks`` on ``x0 * (k + 1)`` ran through ``graphs``, each equal to
    ``want[k]`` bit for bit."""
    modes = []
    with torch.no_grad():
        for k in range(len(want)):
            out, mode = graphs.run(blocks, (x0 * (k + 1),), {}, fingerprint=(id(streamer),), warm_key=streamed)
            modes.append(mode)
            assert torch.equal(out, want[k]), f"seed {seed} pass {k} ({mode})"
    return modes


def test_streamed_forward_captured_as_a_graph_replays_its_copies():
    """Per-pass streaming (``per_pass``) captured by ``PassGraphs``: the replays equal the resident forward bit for
    bit, the first replayed pass streams from empty slots (nothing queued by the pass before), and the copies are in
    the graph: a host weight changed in place after the capture reaches the replay's output. The same blocks streamed
    again through a new streamer with the same plan (a parked MODEL loaded again) are captured at their first pass,
    with no eager pass, and equal the resident forward too."""
    from comfyui_ideogram4_int8.ideogram4.graph_replay import PassGraphs

    seed = int.from_bytes(os.urandom(3), "little")
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = torch.nn.Sequential(*[_Block(i, g) for i in range(6)])
    g_again = torch.Generator(device="cuda").manual_seed(seed)
    again = torch.nn.Sequential(*[_Block(i, g_again) for i in range(6)])  # the same weights, other tensors
    x0 = torch.randn(1000, K, generator=g, device="cuda").bfloat16()
    with torch.no_grad():
        want = [blocks(x0 * (k + 1)) for k in range(4)]
    streamed = streaming.spread(3, 6)
    s = _stream(blocks, streamed, True)
    s.per_pass = True
    graphs = PassGraphs()
    modes = _passes(graphs, blocks, s, x0, want, seed, streamed)
    assert modes == ["eager", "captured", "replayed", "replayed"] and not graphs.stats.failures, graphs.stats.failures
    assert s.stats.mispredicted == 0 and not s.queue  # nothing left queued past a forward's last unit
    # the copies are graph nodes: negate one streamed weight in its pinned host memory; the replay reads it
    unit = s.units[-1]  # the last block's w2
    unit.host[0].neg_()
    s.per_pass = True
    with torch.no_grad():
        eager = blocks(x0)  # hooks bind the changed host copy through the streamer
        replayed, mode = graphs.run(blocks, (x0,), {}, fingerprint=(id(s),), warm_key=streamed)
    assert mode == "replayed"
    assert torch.equal(replayed, eager) and not torch.equal(replayed, want[0]), f"seed {seed}"
    graphs.clear()
    s.drain()
    s2 = _stream(again, streamed, True)
    s2.per_pass = True
    modes = _passes(graphs, again, s2, x0, want[:3], seed, streamed)  # a new streamer: no eager pass first
    assert modes == ["captured", "replayed", "replayed"], modes
    assert graphs.stats.direct == 1 and not graphs.stats.retried and not graphs.stats.failures
    graphs.clear()
    s2.drain()
