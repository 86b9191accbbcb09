"""Low-VRAM streaming on a GPU (cuda): int8 weights streamed from pinned memory through the fused kernels equal the
resident run bit for bit, the registry records the fused path on the streamed layers, and the copies run on a
stream of their own, overlapping the GEMMs (read from the profiler's per-stream order, not from a timing bound)."""

from __future__ import annotations

import os

import pytest
import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4 import streaming
from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_forward

pytestmark = pytest.mark.cuda
K, N = 4608, 13824  # attention.qkv of the real model: one block's biggest operand kind


class _Block(torch.nn.Module):
    """Two W8A8 linears of real Ideogram 4 widths (qkv-like, then back to K), int8 weights with outlier channels."""

    def __init__(self, index, g):
        super().__init__()
        self.index = index
        w1 = torch.randn(N, K, generator=g, device="cuda")
        w1[:, 7] *= 30  # outlier input channel
        w2 = torch.randn(K, N, generator=g, device="cuda")
        self.s1, self.s2 = w1.abs().amax(1) / 127, w2.abs().amax(1) / 127
        self.q1 = torch.nn.Parameter((w1 / self.s1[:, None]).round().clamp(-127, 127).to(torch.int8), False)
        self.q2 = torch.nn.Parameter((w2 / self.s2[:, None]).round().clamp(-127, 127).to(torch.int8), False)

    def forward(self, x):
        h = w8a8_forward(x, self.q1, self.s1, site=f"stream/b{self.index}.a")
        return x + w8a8_forward(h, self.q2, self.s2, site=f"stream/b{self.index}.b")


def _stream(blocks, streamed, slots=2):
    units = []
    for i in streamed:
        b = blocks[i]
        host = [b.q1.detach().cpu().pin_memory(), b.q2.detach().cpu().pin_memory()]
        # the resident copies go away (what streaming saves); an unbound block holds empty weights
        b.q1 = torch.nn.Parameter(torch.empty(0, dtype=torch.int8, device="cuda"), False)
        b.q2 = torch.nn.Parameter(torch.empty(0, dtype=torch.int8, device="cuda"), False)

        def bind(views, b=b):
            b._parameters["q1"] = torch.nn.Parameter(views[0], False)
            b._parameters["q2"] = torch.nn.Parameter(views[1], False)

        def unbind(b=b):
            b._parameters["q1"] = torch.nn.Parameter(torch.empty(0, dtype=torch.int8, device="cuda"), False)
            b._parameters["q2"] = torch.nn.Parameter(torch.empty(0, dtype=torch.int8, device="cuda"), False)

        units.append(streaming.StreamUnit(i, host, bind, unbind, [True, True]))
    s = streaming.BlockStreamer(units, torch.device("cuda"), slots, max(u.nbytes for u in units))
    for i in streamed:
        blocks[i].register_forward_pre_hook(lambda m, a, i=i: s.before(i))
        blocks[i].register_forward_hook(lambda m, a, o, i=i: s.after(i))
    return s


def test_streamed_int8_blocks_equal_resident_and_copies_overlap_compute():
    seed = int.from_bytes(os.urandom(3), "little")
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = torch.nn.Sequential(*[_Block(i, g) for i in range(8)])
    x = torch.randn(4608, K, generator=g, device="cuda").bfloat16()
    with torch.no_grad():
        want = blocks(x)
    streamed = streaming.spread(4, 8)
    s = _stream(blocks, streamed)
    kernels.REGISTRY.clear()
    with torch.no_grad():
        blocks(x)  # first forward queues the later ones
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            outs = [blocks(x) for _ in range(2)]
            torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out, want), f"seed {seed}"
    paths = {r.layer: r.path for r in kernels.REGISTRY.layers("stream")}
    for i in streamed:
        assert paths[f"b{i}.a"] == "triton-int8" and paths[f"b{i}.b"] == "triton-int8", paths
    assert s.stats.mispredicted == 0
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = [e for e in events if "HtoD" in e.name]
    kernels_ = [e for e in events if "Memcpy" not in e.name and "Memset" not in e.name]
    assert len(copies) >= 2 * len(streamed), [e.name for e in events][:20]

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
