"""The low-VRAM residency plan, the pieces of a block and the block streamer (ideogram4.streaming), on the CPU.

The streamer's CPU mode copies in place with the same order and bindings as on a GPU, so what it streams (whole
blocks, or a block's pieces: attention, the w1|w3 pair, w2), into which slot, in which order, when a slot is freed,
and that a streamed model computes exactly what the resident one does, are checked here; the overlap of copies and
compute on a copy stream is checked on a GPU (tests/cuda/test_streaming_gpu.py)."""

from __future__ import annotations

import itertools

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
        units.append(_poisoned_unit(i, [blocks[i].a, blocks[i].b]))
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
    uses = [(i, slot) for kind, i, _, slot in s.trace if kind == "use"]
    assert [i for i, _ in uses] == list(streamed) * 3
    # ring order: the k-th copy goes to slot k % slots, and each use finds its unit's copy queued earlier
    copies = [(i, slot) for kind, i, _, slot in s.trace if kind == "copy"]
    assert [slot for _, slot in copies] == [k % len(s.buffers) for k in range(len(copies))]
    for pos, (kind, i, _, slot) in enumerate(s.trace):
        if kind == "use":
            last_copy = max(k for k, e in enumerate(s.trace[:pos]) if e[0] == "copy" and e[1] == i)
            assert s.trace[last_copy][3] == slot
    if slots > 1:  # the next unit's copy is queued when the current one is bound, before its compute (a block ahead)
        for pos, (kind, i, _, _) in enumerate(s.trace):
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


# -- pieces: the plan ------------------------------------------------------------------------------------------------
def _ideogram_pieces(blocks=34):
    """Ideogram 4's pieces per block in MiB-exact bytes: attention 90, gate_up 108, down 54 (int8) or 108 (the
    protected bf16 w2 of every odd block)."""
    return [[90 * MIB, 108 * MIB, (108 if i % 2 else 54) * MIB] for i in range(blocks)]


def test_slot_is_the_largest_piece_of_the_streamed_blocks():
    pieces = _ideogram_pieces()
    pieces[0] = [90 * MIB, 200 * MIB + 5, 54 * MIB]  # a big piece in a block that stays resident
    sizes = [sum(p) for p in pieces]
    fixed = 900 * MIB
    budget = fixed + 20 * 306 * MIB
    plan = streaming.plan_residency(sizes, fixed, budget, slots=3, piece_bytes=pieces)
    assert 0 not in plan.streamed and plan.streamed  # spread starts from the last block
    assert plan.slot_bytes == streaming.aligned(108 * MIB) == max(max(pieces[i]) for i in plan.streamed)
    assert plan.slots == 3 and plan.pieces == 3 * len(plan.streamed)
    assert plan.device_bytes <= budget and plan.streamed_bytes == sum(sizes[i] for i in plan.streamed)
    assert f"{len(plan.streamed)} streamed as {plan.pieces} pieces through 3 slots of 108 MiB" in plan.describe()
    # residency stays per block, spread over the depth as for whole blocks
    assert plan.streamed == streaming.spread(len(plan.streamed), 34)
    # once block 0 streams too, its 200 MiB piece is the slot (aligned)
    need = streaming.minimum_bytes(sizes, fixed, 3, 0, pieces)
    everything = streaming.plan_residency(sizes, fixed, need, 3, 0, pieces)
    assert everything.streamed == tuple(range(34)) and everything.slot_bytes == streaming.aligned(200 * MIB + 5)


def test_pieces_free_slot_memory_for_resident_blocks():
    pieces = _ideogram_pieces()
    sizes = [sum(p) for p in pieces]
    fixed = 900 * MIB
    for resident_blocks in (4, 12, 25):
        budget = fixed + resident_blocks * 279 * MIB
        whole = streaming.plan_residency(sizes, fixed, budget, slots=2)
        split = streaming.plan_residency(sizes, fixed, budget, slots=3, piece_bytes=pieces)
        # 2 x 306 MiB of slots become 3 x 108 MiB: 288 MiB more for resident weights, at least one more block
        assert whole.slots * whole.slot_bytes == 2 * 306 * MIB and split.slots * split.slot_bytes == 3 * 108 * MIB
        assert len(split.resident) >= len(whole.resident) + 1, (resident_blocks, whole, split)
        assert split.streamed_bytes < whole.streamed_bytes and split.device_bytes <= budget
        assert whole.pieces == len(whole.streamed) and " as " not in whole.describe()


def test_minimum_with_pieces_is_the_largest_piece_per_slot():
    pieces = _ideogram_pieces(6)
    sizes = [sum(p) for p in pieces]
    assert streaming.minimum_bytes(sizes, 500 * MIB, 3, 100 * MIB, pieces) == 400 * MIB + 3 * 108 * MIB
    assert streaming.minimum_bytes(sizes, 500 * MIB, 2, 100 * MIB) == 400 * MIB + 2 * 306 * MIB
    need = streaming.minimum_bytes(sizes, 500 * MIB, 3, 0, pieces)
    assert streaming.plan_residency(sizes, 500 * MIB, need, 3, 0, pieces).streamed == tuple(range(6))
    with pytest.raises(streaming.InsufficientVRAMError) as err:
        streaming.plan_residency(sizes, 500 * MIB, need - 1, 3, 0, pieces)
    assert f"{need / streaming.GIB:.2f} GiB" in str(err.value)
    with pytest.raises(ValueError):
        streaming.plan_residency(sizes, 500 * MIB, need, 3, 0, pieces[:-1])


# -- pieces: a block of Ideogram 4's layout ------------------------------------------------------------------------
class _Attention(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.o = torch.nn.Linear(3 * d, d, bias=False)

    def forward(self, x):
        return self.o(torch.tanh(self.qkv(x)))


class _FeedForward(torch.nn.Module):
    """w2(silu(w1 x) * w3 x) with w1 and w3 read in place, not called (as the fused pair kernel reads them)."""

    def __init__(self, d, f):
        super().__init__()
        self.w1 = torch.nn.Linear(d, f, bias=False)
        self.w2 = torch.nn.Linear(f, d, bias=False)
        self.w3 = torch.nn.Linear(d, f, bias=False)
        self.fail = False  # raise between the pair and w2 (a forward interrupted inside a block)

    def forward(self, x):
        h = torch.nn.functional.silu(x @ self.w1.weight.T) * (x @ self.w3.weight.T)
        if self.fail:
            raise RuntimeError("interrupted on purpose")
        return self.w2(h)


class _IdeoBlock(torch.nn.Module):
    """adaln_modulation, attention (qkv, o), then the FFN: the order of ComfyUI's Ideogram4TransformerBlock."""

    def __init__(self, d, f, g):
        super().__init__()
        self.attention = _Attention(d)
        self.feed_forward = _FeedForward(d, f)
        self.adaln_modulation = torch.nn.Linear(d, 2 * d)  # its bias stays on the device: only weights stream
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.weight.shape[1] ** 0.5)

    def forward(self, x):
        scale, gate = self.adaln_modulation(x).chunk(2, dim=-1)
        x = x + torch.tanh(gate) * self.attention(x * (1 + scale))
        return x + self.feed_forward(x)


def _linears(block):
    return [(n, m) for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)]


def _names(pieces):
    return [(p.name, [n for n, _ in p.modules]) for p in pieces]


def test_a_block_of_ideogram4s_layout_is_three_pieces_in_call_order():
    block = _IdeoBlock(8, 16, torch.Generator().manual_seed(1))
    pieces = streaming.block_pieces(block, _linears(block))
    assert _names(pieces) == [
        ("attention", ["attention.qkv", "attention.o", "adaln_modulation"]),
        ("gate_up", ["feed_forward.w1", "feed_forward.w3"]),
        ("down", ["feed_forward.w2"]),
    ]
    assert [p.at for p in pieces] == [block, block.feed_forward, block.feed_forward.w2]
    every = [m for p in pieces for _, m in p.modules]
    assert len(every) == len({id(m) for m in every}) == len(_linears(block))  # each streamable once
    # the pair: hooks bind it at the FFN, none on w1 or w3 (a hooked module's forward must run: the pair would split)
    s = _streamer({0: pieces}, slots=3)
    handles = streaming.hook_pieces(s, 0, pieces)
    ff = block.feed_forward
    assert not (ff.w1._forward_pre_hooks or ff.w1._forward_hooks or ff.w3._forward_pre_hooks or ff.w3._forward_hooks)
    assert len(ff._forward_pre_hooks) == 1 and not ff._forward_hooks
    assert len(ff.w2._forward_pre_hooks) == len(ff.w2._forward_hooks) == 1
    assert len(block._forward_pre_hooks) == 1 and not block._forward_hooks  # w2's hook releases the block's last
    assert len(handles) == 4


def test_other_layouts_stream_whole_blocks():
    g = torch.Generator().manual_seed(2)
    block = _IdeoBlock(8, 16, g)
    linears = _linears(block)
    whole = [("block", [n for n, _ in linears])]
    assert _names(streaming.block_pieces(block, linears, split=False)) == whole  # the caller does not know the FFN
    block.feed_forward.w13 = torch.nn.Linear(8, 32, bias=False)  # an FFN of another layout
    assert _names(streaming.block_pieces(block, _linears(block))) == [("block", [n for n, _ in _linears(block)])]
    del block.feed_forward.w13
    plain = _Block(8, 16, g)  # no feed_forward at all
    assert _names(streaming.block_pieces(plain, _linears(plain))) == [("block", ["a", "b"])]
    # pieces with nothing streamable are left out (w1 / w3 resident: the attention piece runs on to w2)
    some = [(n, m) for n, m in linears if n not in ("feed_forward.w1", "feed_forward.w3")]
    pieces = streaming.block_pieces(block, some)
    assert [p.name for p in pieces] == ["attention", "down"]


def _poisoned_unit(index, mods, piece=streaming.WHOLE):
    """A unit of ``mods``: host copies of their weights, the modules poisoned (NaN) until bound."""
    host = [m.weight.detach().clone() for m in mods]
    for m in mods:
        m.weight = torch.nn.Parameter(torch.full_like(m.weight, float("nan")), requires_grad=False)
    poisoned = [m.weight for m in mods]

    def bind(views):
        for m, v in zip(mods, views, strict=True):
            m._parameters["weight"] = torch.nn.Parameter(v, requires_grad=False)

    def unbind():
        for m, w in zip(mods, poisoned, strict=True):
            m._parameters["weight"] = w

    return streaming.StreamUnit(index, host, bind, unbind, [False] * len(host), piece)


def _host_units(index, pieces):
    """A unit per piece (``_poisoned_unit``)."""
    return [_poisoned_unit(index, [m for _, m in p.modules], p.name) for p in pieces]


def _streamer(pieces, slots):
    """A CPU streamer over ``pieces`` (block -> its pieces, in forward order), the modules poisoned until bound."""
    units = [u for i, p in pieces.items() for u in _host_units(i, p)]
    return streaming.BlockStreamer(units, torch.device("cpu"), slots, max(u.nbytes for u in units))


def _streamed_pieces(blocks, streamed, slots, split=True):
    """``blocks`` whose ``streamed`` ones stream as pieces (``split``) through ``slots``, hooked as in the patcher."""
    pieces = {i: streaming.block_pieces(blocks[i], _linears(blocks[i]), split) for i in streamed}
    s = _streamer(pieces, slots)
    for i in streamed:
        streaming.hook_pieces(s, i, pieces[i])
    return s


def _ideo_model(seed, n=6, d=16, f=40):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Sequential(*[_IdeoBlock(d, f, g) for _ in range(n)]), torch.randn(5, d, generator=g)


def _check_slots_never_overwritten_in_use(trace, busy=None):
    """A copy goes only into a slot whose occupant was released (on a GPU: after its freed event). ``busy``: slot ->
    the unit bound in it when ``trace`` starts."""
    busy = dict(busy or {})
    for kind, i, piece, slot in trace:
        if kind == "copy":
            assert slot not in busy, (i, piece, slot, busy)
        elif kind == "use":
            busy[slot] = (i, piece)
        else:
            assert busy.pop(slot) == (i, piece)


def _odd_blocks_streamed(slots):
    """(seed, blocks, x, the resident output, streamed blocks, streamer): a fresh model whose blocks 1, 3 and 5 stream
    as pieces through ``slots``."""
    seed = int.from_bytes(__import__("os").urandom(3), "little")
    blocks, x = _ideo_model(seed)
    with torch.no_grad():
        want = blocks(x)
    streamed = (1, 3, 5)
    return seed, blocks, x, want, streamed, _streamed_pieces(blocks, streamed, slots)


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_pieces_stream_equal_to_resident_and_each_binding_frees_the_piece_before(slots):
    seed, blocks, x, want, streamed, s = _odd_blocks_streamed(slots)
    between = []  # what is bound when a resident block starts: nothing (w2's hook released the block before)
    for i in (0, 2, 4):
        blocks[i].register_forward_pre_hook(lambda m, a: between.append(s.current))
    s.tracing = True
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(blocks(x), want), f"seed {seed}"
    order = [(i, p) for i in streamed for p in ("attention", "gate_up", "down")]
    assert [u.key for u in s.units] == order and len(s.buffers) == slots
    assert between == [None] * 9
    events = [e for e in s.trace if e[0] != "copy"]
    assert [(e[0], e[1], e[2]) for e in events] == [(k, *u) for u in order * 3 for k in ("use", "free")]
    for use, free in zip(events[::2], events[1::2], strict=True):
        assert use[3] == free[3]  # freed from the slot it was used in
    for t, e in enumerate(s.trace):  # binding a piece of a block releases the piece before it, right there
        if e[0] == "use" and e[2] != "attention":
            prev = order[order.index((e[1], e[2])) - 1]
            before = [f for f in s.trace[:t] if f[0] != "copy"]  # one slot: the copy comes between (on demand)
            assert before[-1][:3] == ("free", *prev), (t, s.trace[t - 3 : t + 1])
    _check_slots_never_overwritten_in_use(s.trace)
    assert s.stats.mispredicted == 0 and s.stats.forwards == 3 and s.current is None
    for i in streamed:
        assert torch.isnan(blocks[i].feed_forward.w1.weight).all()  # unbound after the forward


@pytest.mark.parametrize("slots", [2, 3])
def test_pieces_prefetch_in_order_across_blocks_and_around_the_forward(slots):
    blocks, x = _ideo_model(11)
    streamed = (0, 2, 5)
    s = _streamed_pieces(blocks, streamed, slots)
    s.tracing = True
    forwards = 3
    with torch.no_grad():
        for _ in range(forwards):
            blocks(x)
    n = len(s.units)
    copies = [(e[1], e[2], e[3]) for e in s.trace if e[0] == "copy"]
    # every copy in forward order, wrapping around into the next forward, each into the next slot of the ring
    assert [(i, p) for i, p, _ in copies] == [s.units[k % n].key for k in range(len(copies))]
    assert [slot for *_, slot in copies] == [k % slots for k in range(len(copies))]
    # when the k-th piece is bound, the copies of the next slots - 1 are queued (about a block ahead with 3 slots)
    uses = issued = 0
    for t, e in enumerate(s.trace):
        issued += e[0] == "copy"
        if e[0] == "use":
            uses += 1
            queued = issued + len(list(itertools.takewhile(lambda f: f[0] == "copy", s.trace[t + 1 :])))
            assert queued == uses + slots - 1, (t, s.trace[max(0, t - 4) : t + 4])
    assert uses == forwards * n
    # around the wrap: the next forward's first pieces are queued before this forward's last piece is released
    end = next(t for t, e in enumerate(s.trace) if e[:3] == ("free", 5, "down"))
    ahead = [e[1:3] for e in s.trace[:end] if e[0] == "copy"][n:]
    assert ahead == [s.units[k].key for k in range(slots - 1)] == [(0, "attention"), (0, "gate_up")][: slots - 1]
    assert s.stats.mispredicted == 0 and s.copies == forwards * n + slots - 1


@pytest.mark.parametrize("slots", [2, 3])
def test_per_pass_streaming_queues_nothing_past_the_forward(slots):
    """``per_pass`` (a forward that may be captured as a CUDA graph): each forward copies its own pieces only, the
    first one when it starts; nothing is left queued at its end; eager forwards before it (cross-forward prefetch)
    leave nothing the next per-pass forward waits for; the output stays the resident one."""
    seed, blocks, x, want, streamed, s = _odd_blocks_streamed(slots)
    with torch.no_grad():
        assert torch.equal(blocks(x), want)  # an eager forward: the next forward's first pieces are queued
    assert len(s.queue) == slots - 1
    s.per_pass, s.tracing = True, True
    n, forwards = len(s.units), 3
    with torch.no_grad():
        for _ in range(forwards):
            assert torch.equal(blocks(x), want), f"seed {seed}"
            assert not s.queue and s.current is None
    copies = [e[1:3] for e in s.trace if e[0] == "copy"]
    assert copies == [u.key for u in s.units] * forwards  # each forward its own pieces, in order, none ahead
    first_use = [t for t, e in enumerate(s.trace) if e[:3] == ("use", *s.units[0].key)]
    for t in first_use:  # a forward's first piece is copied when it starts, right before its use
        assert s.trace[t - 1][:3] == ("copy", *s.units[0].key)
    _check_slots_never_overwritten_in_use(s.trace)
    slot_of = [[e[3] for e in s.trace if e[0] == "use"][f * n : (f + 1) * n] for f in range(forwards)]
    assert slot_of == [[k % slots for k in range(n)]] * forwards  # the slots a capture saw, every forward
    assert s.stats.mispredicted == 0 and s.copies == (forwards + 1) * n + slots - 1
    s.per_pass = False  # back to eager: the prefetch around the forward resumes
    with torch.no_grad():
        assert torch.equal(blocks(x), want)
    assert len(s.queue) == slots - 1 and s.stats.mispredicted == 0


def test_an_interrupted_piece_frees_its_slot():
    blocks, x = _ideo_model(12, n=4)
    with torch.no_grad():
        want = blocks(x)
    s = _streamed_pieces(blocks, (1, 3), slots=3)
    s.tracing = True
    blocks[3].feed_forward.fail = True
    with torch.no_grad(), pytest.raises(RuntimeError, match="on purpose"):
        blocks(x)  # block 3 raised with its gate_up piece bound: its release hook never ran
    assert s.current is not None and s.units[s.current[0]].key == (3, "gate_up")
    stuck = s.current[1]
    blocks[3].feed_forward.fail = False
    mark = len(s.trace)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(blocks(x), want)
    assert s.trace[mark][:4] == ("free", 3, "gate_up", stuck)  # released by the next binding, before anything else
    assert s.current is None
    _check_slots_never_overwritten_in_use(s.trace[mark:], {stuck: (3, "gate_up")})


def test_a_block_streamed_whole_among_pieces():
    blocks, x = _ideo_model(13, n=5)
    with torch.no_grad():
        want = blocks(x)
    # block 2 streams whole (its caller did not know its FFN): its units and hooks mix with the others' pieces
    pieces = {i: streaming.block_pieces(blocks[i], _linears(blocks[i]), split=i != 2) for i in (0, 2, 4)}
    s = _streamer(pieces, slots=3)
    for i in pieces:
        streaming.hook_pieces(s, i, pieces[i])
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(blocks(x), want)
    assert [u.key for u in s.units][2:5] == [(0, "down"), (2, "block"), (4, "attention")] and len(s.units) == 7
    assert s.stats.mispredicted == 0 and s.current is None and s.stats.forwards == 2
