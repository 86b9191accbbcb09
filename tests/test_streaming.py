"""The low-VRAM residency plan and the block streamer (ideogram4.streaming), on the CPU.

The streamer's CPU mode copies in place with the same order and bindings as on a GPU, so what it streams, into
which slot, in which order, and that a streamed model computes exactly what the resident one does, are checked
here; the overlap of copies and compute on a copy stream is checked on a GPU (tests/test_streaming_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.ideogram4 import streaming

MIB = 2**20


def test_everything_fits_streams_nothing():
    plan = streaming.plan_residency([100 * MIB] * 4, 50 * MIB, budget=450 * MIB)
    assert plan.streamed == () and plan.resident == (0, 1, 2, 3) and plan.slots == 0
    assert plan.device_bytes == 450 * MIB and plan.streamed_bytes == 0


@pytest.mark.parametrize("blocks", [34, 7])
def test_fewest_blocks_stream_spread_over_the_depth(blocks):
    sizes = [264 * MIB] * blocks
    fixed = 500 * MIB
    for budget_blocks in range(3, blocks):
        budget = fixed + budget_blocks * 264 * MIB
        plan = streaming.plan_residency(sizes, fixed, budget, slots=2)
        # two slots of one block each cost two resident blocks: budget_blocks - 2 stay
        assert len(plan.resident) == budget_blocks - 2, (budget_blocks, plan)
        assert plan.device_bytes <= budget
        assert sorted(plan.resident + plan.streamed) == list(range(blocks))
        assert plan.streamed[-1] == blocks - 1  # the last block's copy has the whole forward before it
        gaps = [b - a for a, b in zip(plan.streamed, plan.streamed[1:], strict=False)]
        if gaps:
            assert max(gaps) - min(gaps) <= 1 + blocks // len(plan.streamed) // 2  # evenly spread
        assert plan.streamed_bytes == len(plan.streamed) * 264 * MIB


def test_host_layers_leave_the_card_only_once_something_streams():
    sizes, fixed, host = [264 * MIB] * 34, 900 * MIB, 450 * MIB
    everything = fixed + sum(sizes)
    full = streaming.plan_residency(sizes, fixed, everything, host_bytes=host)
    assert full.streamed == () and full.host_bytes == 0 and full.device_bytes == everything
    budget = fixed + 20 * 264 * MIB
    without = streaming.plan_residency(sizes, fixed, budget)
    with_host = streaming.plan_residency(sizes, fixed, budget, host_bytes=host)
    assert with_host.host_bytes == host and with_host.fixed_bytes == fixed - host
    assert with_host.device_bytes <= budget
    # 450 MiB off the card is one more resident block (264 MiB) and change: one block less crosses per forward
    assert len(with_host.streamed) == len(without.streamed) - 1
    assert with_host.streamed_bytes == without.streamed_bytes - 264 * MIB
    assert "0.44 GiB of unused layers left on the host" in with_host.describe()
    need = streaming.minimum_bytes(sizes, fixed, 2, host)
    assert need == streaming.minimum_bytes(sizes, fixed, 2) - host
    assert streaming.plan_residency(sizes, fixed, need, host_bytes=host).streamed == tuple(range(34))
    with pytest.raises(streaming.InsufficientVRAMError):
        streaming.plan_residency(sizes, fixed, need - 1, host_bytes=host)


def test_slot_is_the_largest_streamed_block_aligned():
    sizes = [100 * MIB + 3, 150 * MIB + 1, 100 * MIB, 150 * MIB + 1]
    plan = streaming.plan_residency(sizes, 0, budget=sum(sizes) - 1)
    assert plan.slot_bytes == streaming.aligned(max(sizes[i] for i in plan.streamed))
    assert plan.slot_bytes % streaming.ALIGN == 0


def test_too_little_vram_names_the_minimum():
    with pytest.raises(streaming.InsufficientVRAMError) as err:
        streaming.plan_residency([264 * MIB] * 34, 500 * MIB, budget=600 * MIB, slots=2)
    need = streaming.minimum_bytes([264 * MIB] * 34, 500 * MIB, 2)
    assert f"{need / streaming.GIB:.2f} GiB" in str(err.value) and "0.59 GiB is free" in str(err.value)
    assert type(err.value).__module__ == "comfyui_ideogram4_int8"


class _Block(torch.nn.Module):
    def __init__(self, k, n, g):
        super().__init__()
        self.a = torch.nn.Linear(k, n, bias=False)
        self.b = torch.nn.Linear(n, k, bias=False)
        with torch.no_grad():
            self.a.weight.copy_(torch.randn(n, k, generator=g))
            self.b.weight.copy_(torch.randn(k, n, generator=g))

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


def _streamed_model(blocks, streamed, slots):
    """``blocks`` with the weights of ``streamed`` kept as host tensors outside the modules (poisoned parameters in
    the modules until bound), and a streamer over them."""
    units, hooks = [], []
    for i in streamed:
        mods = [blocks[i].a, blocks[i].b]
        host = [m.weight.detach().clone() for m in mods]
        for m in mods:
            m.weight = torch.nn.Parameter(torch.full_like(m.weight, float("nan")))
        poisoned = [m.weight for m in mods]

        def bind(views, mods=mods):
            for m, v in zip(mods, views, strict=True):
                m._parameters["weight"] = torch.nn.Parameter(v, requires_grad=False)

        def unbind(mods=mods, poisoned=poisoned):
            for m, p in zip(mods, poisoned, strict=True):
                m._parameters["weight"] = p

        units.append(streaming.StreamUnit(i, host, bind, unbind, [False, False]))
    slot = max(u.nbytes for u in units)
    s = streaming.BlockStreamer(units, torch.device("cpu"), slots, slot)
    for i in streamed:
        hooks.append(blocks[i].register_forward_pre_hook(lambda m, a, i=i: s.before(i)))
        hooks.append(blocks[i].register_forward_hook(lambda m, a, o, i=i: s.after(i)))
    return s


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_streamed_forward_equals_resident_and_prefetches_in_order(slots):
    g = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(3), "little"))
    blocks = torch.nn.Sequential(*[_Block(24, 40, g) for _ in range(6)])
    x = torch.randn(5, 24, generator=g)
    with torch.no_grad():
        want = blocks(x)
    streamed = (1, 3, 5)
    s = _streamed_model(blocks, streamed, slots)
    s.tracing = True
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(blocks(x), want)
    assert len(s.buffers) == min(slots, 3)  # reused: no buffer per unit
    uses = [(i, slot) for kind, i, slot in s.trace if kind == "use"]
    assert [i for i, _ in uses] == list(streamed) * 3
    # ring order: the k-th copy goes to slot k % slots, and each use finds its unit's copy queued earlier
    copies = [(i, slot) for kind, i, slot in s.trace if kind == "copy"]
    assert [slot for _, slot in copies] == [k % len(s.buffers) for k in range(len(copies))]
    for pos, (kind, i, slot) in enumerate(s.trace):
        if kind == "use":
            last_copy = max(k for k, e in enumerate(s.trace[:pos]) if e[0] == "copy" and e[1] == i)
            assert s.trace[last_copy][2] == slot
    if slots > 1:  # the next unit's copy is queued when the current one is bound, before its compute (a block ahead)
        for pos, (kind, i, _) in enumerate(s.trace):
            if kind == "use" and pos + 1 < len(s.trace):
                nxt = streamed[(streamed.index(i) + 1) % len(streamed)]
                assert ("copy", nxt) in [(e[0], e[1]) for e in s.trace[: pos + 2]], (pos, s.trace)
    assert s.stats.mispredicted == 0 and s.copies == 3 * 3 + len(s.buffers) - 1  # + the next forward's, queued
    assert s.stats.forwards == 3
    for i in streamed:  # unbound after the forward: the module holds its (poisoned) host-side parameter again
        assert torch.isnan(blocks[i].a.weight).all()


def test_an_unexpected_order_is_served_and_counted():
    g = torch.Generator().manual_seed(7)
    blocks = torch.nn.Sequential(*[_Block(16, 24, g) for _ in range(4)])
    x = torch.randn(3, 16, generator=g)
    with torch.no_grad():
        want_2 = blocks[2](x)
    s = _streamed_model(blocks, (0, 2), slots=2)
    with torch.no_grad():
        blocks(x)
        got = blocks[2](x)  # block 2 alone: its copy was not queued for this call
    assert torch.equal(got, want_2)
    assert s.stats.mispredicted == 1


def test_an_interrupted_block_frees_its_slot():
    g = torch.Generator().manual_seed(8)
    blocks = torch.nn.Sequential(*[_Block(16, 24, g) for _ in range(3)])
    x = torch.randn(3, 16, generator=g)
    with torch.no_grad():
        want = blocks(x)
    s = _streamed_model(blocks, (0, 1), slots=2)
    s.before(0)  # a forward that raised inside block 0: after() never ran
    with torch.no_grad():
        assert torch.equal(blocks(x), want)
    assert s.current is None
