"""Weights that do not fit the card, streamed per forward behind the compute: the residency plan and the streamer.

A DiT runs its blocks in order, every forward. When the card cannot hold every block, some blocks' big weights (the
int8 GEMM operands, and bf16 protected layers) stay in pinned host memory and cross the bus once per forward:

* ``plan_residency`` decides which blocks stay on the card and which stream, from a byte budget: the fewest blocks
  stream, spread evenly over the depth, so that every streamed block has resident compute before it to hide behind.
* ``block_pieces`` cuts a streamed block into the pieces its forward uses one after the other: Ideogram 4's block
  runs adaln_modulation, attention.qkv and attention.o ("attention", 90 MiB of int8), then its FFN's w1 and w3 as
  one fused pair kernel ("gate_up", 108 MiB), then w2 ("down", 54 MiB, or 108 MiB as a protected bf16 layer). The
  streamed unit is a piece, so a slot holds the largest piece (108 MiB) instead of the largest block (306 MiB).
* ``BlockStreamer`` copies the units (pieces, or whole blocks) into a few reused device buffers (slots) on a copy
  stream, ahead of the code that needs them: when unit ``u`` is bound, the unit bound before it is released (its slot
  is free once the kernels queued so far have run) and the copies of the next ``slots - 1`` units are queued, each
  waiting only for its slot's previous occupant to finish computing. The compute stream waits for ``u``'s copy
  alone. Weights stay in their stored form (int8 stays int8): the kernels read the slot as they read a resident
  weight. Three slots of pieces keep about a block in flight, as two slots of whole blocks did.
  With ``per_pass`` set, no copy is queued past a forward's last unit and each forward starts from empty slots, so
  the forward can be captured as one CUDA graph: its copies from pinned memory and the events between the two
  streams become part of the graph, and a replay streams the weights with no Python hook running.

This module knows nothing of ComfyUI: what a unit's tensors are and how a module is pointed at a slot are callbacks
(``StreamUnit``), and the caller says whether a block's FFN runs its pair before w2 (``block_pieces(split=...)``);
``nodes/runtime/streaming_patcher.py`` wires it to ComfyUI's ModelPatcher.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

import torch

from .errors import public_error

ALIGN = 256  # bytes: every tensor in a slot starts at a multiple (the kernels' and TMA's alignment needs)
GIB = 1024**3
MIB = 2**20
WHOLE = "block"  # the name of the one piece of a block streamed whole
FFN, GATE_UP, DOWN = "feed_forward", ("w1", "w3"), "w2"  # Ideogram 4's FFN: w2(silu(w1 x) * w3 x)


@public_error
class InsufficientVRAMError(RuntimeError):
    """The card cannot hold even the streaming minimum of a model (its fixed weights and its copy slots)."""


@dataclasses.dataclass(frozen=True)
class ResidencyPlan:
    """Which blocks stay on the card (``resident``) and which cross per forward (``streamed``), and the bytes."""

    resident: tuple[int, ...]
    streamed: tuple[int, ...]
    slots: int  # device buffers that streamed pieces take turns in (0 when nothing streams)
    slot_bytes: int  # one slot: the largest piece of the streamed blocks, aligned
    fixed_bytes: int  # weights outside the blocks on the card
    resident_bytes: int  # fixed + resident blocks' streamable weights
    streamed_bytes: int  # crossing the bus per forward
    host_bytes: int = 0  # weights outside the blocks left on the host (layers this model does not run)
    pieces: int = 0  # streamed units per forward: the streamed blocks' pieces (one per block streamed whole)

    @property
    def device_bytes(self) -> int:
        """Weights plus slots on the card."""
        return self.resident_bytes + self.slots * self.slot_bytes

    def describe(self) -> str:
        if not self.streamed:
            return f"all {len(self.resident)} blocks resident ({self.resident_bytes / GIB:.2f} GiB)"
        host = f", {self.host_bytes / GIB:.2f} GiB of unused layers left on the host" if self.host_bytes else ""
        return (
            f"{len(self.resident)} blocks resident, {self.streaming()}: {self.device_bytes / GIB:.2f} GiB on the "
            f"card, {self.streamed_bytes / GIB:.2f} GiB from pinned host memory per forward{host}"
        )

    def streaming(self) -> str:
        """What streams and through what, e.g. "31 streamed as 93 pieces through 3 slots of 108 MiB"."""
        pieces = f" as {self.pieces} pieces" if self.pieces > len(self.streamed) else ""
        return f"{len(self.streamed)} streamed{pieces} through {self.slots} slots of {mib(self.slot_bytes)}"


def aligned(nbytes: int) -> int:
    return (int(nbytes) + ALIGN - 1) // ALIGN * ALIGN


def mib(nbytes: int) -> str:
    x = nbytes / MIB
    return f"{x:.0f} MiB" if x >= 10 else f"{x:.2f} MiB"


def spread(count: int, total: int) -> tuple[int, ...]:
    """``count`` indices of ``range(total)`` spread evenly (the last block always among them once any stream: its
    copy has the whole forward before it)."""
    if count <= 0:
        return ()
    if count >= total:
        return tuple(range(total))
    return tuple(sorted({total - 1 - int(k * total / count) for k in range(count)}))


def _units(block_bytes: Sequence[int], piece_bytes: Sequence[Sequence[int]] | None) -> list[tuple[int, int]]:
    """Per block: (its largest piece, aligned; its number of pieces). Without ``piece_bytes`` a block is one piece."""
    if piece_bytes is None:
        return [(aligned(b), 1) for b in block_bytes]
    if len(piece_bytes) != len(block_bytes):
        raise ValueError(f"piece_bytes has {len(piece_bytes)} blocks, block_bytes {len(block_bytes)}")
    return [(max((aligned(p) for p in pieces), default=0), len(pieces)) for pieces in piece_bytes]


def minimum_bytes(
    block_bytes: Sequence[int],
    fixed_bytes: int,
    slots: int = 2,
    host_bytes: int = 0,
    piece_bytes: Sequence[Sequence[int]] | None = None,
) -> int:
    """The least a model needs on the card with every block streamed (``piece_bytes``: as in ``plan_residency``)."""
    largest = max((u for u, _ in _units(block_bytes, piece_bytes)), default=0)
    return int(fixed_bytes) - int(host_bytes) + slots * largest


def plan_residency(
    block_bytes: Sequence[int],
    fixed_bytes: int,
    budget: float,
    slots: int = 2,
    host_bytes: int = 0,
    piece_bytes: Sequence[Sequence[int]] | None = None,
) -> ResidencyPlan:
    """The plan that streams the fewest blocks and fits ``budget`` bytes on the card.

    ``block_bytes[i]``: the streamable bytes of block ``i`` (its big weights); ``fixed_bytes``: everything outside the
    blocks (top-level layers, norms, scales, biases); ``host_bytes``: the part of it that may stay on the host once
    anything streams (a layer the model's forwards do not run: each byte left there is one streamed byte less per
    forward); ``piece_bytes[i]``: the bytes of block ``i``'s pieces as it streams (``block_pieces``; by default each
    block is one piece). Residency is per block; a slot holds the largest piece of the streamed blocks.
    Raises ``InsufficientVRAMError`` naming the minimum when even streaming every block does not fit."""
    sizes = [int(b) for b in block_bytes]
    units = _units(sizes, piece_bytes)
    n = len(sizes)
    everything = int(fixed_bytes) + sum(sizes)
    if everything <= budget:
        return ResidencyPlan(tuple(range(n)), (), 0, 0, int(fixed_bytes), everything, 0)
    host_bytes = int(host_bytes)
    fixed_bytes = int(fixed_bytes) - host_bytes
    for count in range(1, n + 1):
        streamed = spread(count, n)
        slot = max(units[i][0] for i in streamed)
        kept = tuple(i for i in range(n) if i not in streamed)
        resident = fixed_bytes + sum(sizes[i] for i in kept)
        if resident + slots * slot <= budget:
            crossing = sum(sizes[i] for i in streamed)
            pieces = sum(units[i][1] for i in streamed)
            return ResidencyPlan(kept, streamed, slots, slot, fixed_bytes, resident, crossing, host_bytes, pieces)
    need = minimum_bytes(sizes, fixed_bytes, slots, 0, piece_bytes)
    raise InsufficientVRAMError(
        f"the model needs at least {need / GIB:.2f} GiB of VRAM for its weights with every block streamed "
        f"({fixed_bytes / GIB:.2f} GiB that stays on the card + {slots} copy slots), and "
        f"{max(budget, 0) / GIB:.2f} GiB is free for it. Close other programs using the GPU, lower --reserve-vram, "
        "or run on a card with more memory"
    )


# -- the pieces of a block ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Piece:
    """Streamable modules of a block bound together: ``modules`` ((name in the block, module)) are bound by a forward
    pre-hook on ``at``; the block's last piece is released by ``at``'s forward hook too."""

    name: str
    modules: tuple[tuple[str, torch.nn.Module], ...]
    at: torch.nn.Module


def block_pieces(
    block: torch.nn.Module, streamable: Sequence[tuple[str, torch.nn.Module]], split: bool = True
) -> list[Piece]:
    """The pieces of ``block``'s ``streamable`` modules ((name in the block, module)) in the order its forward binds
    them; every streamable module is in exactly one.

    Ideogram 4's block runs adaln_modulation and its attention first, then ``feed_forward``, which runs w1 and w3 (one
    fused pair kernel) before w2. So: "attention", every streamable module outside the FFN, bound when the block
    starts; "gate_up", w1 + w3, bound when the FFN starts (w1 and w3 themselves get no hooks: the pair runs fused only
    on modules without hooks, nodes/runtime/ffn_fusion.py); "down", w2, bound when w2 starts and released when it
    returned. A piece with nothing streamable is left out. Without ``split`` (the caller does not know that the FFN is
    called as a module and runs its pair before w2), without a ``feed_forward.w2`` module, or with other streamable
    modules in the FFN, the block streams whole: one piece, bound and released by the block's own hooks."""
    streamable = tuple(streamable)
    whole = [Piece(WHOLE, streamable, block)]
    ffn = getattr(block, FFN, None)
    down = getattr(ffn, DOWN, None)
    if not split or not isinstance(ffn, torch.nn.Module) or not isinstance(down, torch.nn.Module):
        return whole
    gate_up = {f"{FFN}.{n}" for n in GATE_UP}
    inside = [(n, m) for n, m in streamable if n.startswith(f"{FFN}.")]
    if any(n not in gate_up and n != f"{FFN}.{DOWN}" for n, _ in inside):
        return whole  # an FFN of another layout: its call order is not known
    pieces = [
        Piece("attention", tuple((n, m) for n, m in streamable if not n.startswith(f"{FFN}.")), block),
        Piece("gate_up", tuple((n, m) for n, m in inside if n in gate_up), ffn),
        Piece("down", tuple((n, m) for n, m in inside if n == f"{FFN}.{DOWN}"), down),
    ]
    return [p for p in pieces if p.modules] or whole


class _Bind:
    leaves_input_alone = True  # reads no argument of the module it runs before (nodes/runtime/block_norms.py asks)

    def __init__(self, streamer, index: int, piece: str):
        self.streamer, self.index, self.piece = streamer, index, piece

    def __call__(self, module, args):
        self.streamer.before(self.index, self.piece)


class _Release:
    def __init__(self, streamer, index: int, piece: str, then: Callable[[], None] | None):
        self.streamer, self.index, self.piece, self.then = streamer, index, piece, then

    def __call__(self, module, args, output):
        self.streamer.after(self.index, self.piece)
        if self.then is not None:
            self.then()


def hook_pieces(streamer, index: int, pieces: Sequence[Piece], then: Callable[[], None] | None = None) -> list:
    """The hooks that run ``streamer``'s protocol for block ``index``: each piece bound by a forward pre-hook on its
    ``at`` module (binding releases the piece before it), the block's last piece released by its ``at`` module's
    forward hook, which then calls ``then`` (if given). Returns the handles, to ``remove()`` when streaming stops."""
    handles = [p.at.register_forward_pre_hook(_Bind(streamer, index, p.name)) for p in pieces]
    last = pieces[-1]
    handles.append(last.at.register_forward_hook(_Release(streamer, index, last.name, then)))
    return handles


@dataclasses.dataclass
class StreamUnit:
    """One streamed piece of block ``index`` (``piece``: its name, ``WHOLE`` for a whole block): its host tensors
    (pinned where possible) and how to point its modules at device copies.

    ``bind(views)`` gets one device tensor per host tensor (same shape and dtype, inside a slot); ``unbind()`` puts
    the host tensors back. ``pinned[i]`` says whether host tensor i is page-locked (asynchronous copy)."""

    index: int
    host: list[torch.Tensor]
    bind: Callable[[list[torch.Tensor]], None]
    unbind: Callable[[], None]
    pinned: list[bool] = dataclasses.field(default_factory=list)
    piece: str = WHOLE

    @property
    def key(self) -> tuple[int, str]:
        return self.index, self.piece

    @property
    def nbytes(self) -> int:
        return sum(aligned(t.numel() * t.element_size()) for t in self.host)


@dataclasses.dataclass
class StreamStats:
    """What crossed the bus in the last measured forward(s) of one model."""

    forwards: int = 0
    bytes_per_forward: int = 0
    copy_ms: float = 0.0  # per forward: time the copies took on the copy stream
    wait_ms: float = 0.0  # per forward: time the compute stream could have waited for a copy (not hidden)
    pageable: int = 0  # host tensors that are not page-locked (copied synchronously)
    mispredicted: int = 0  # units whose copy was not queued ahead (a forward that did not follow the order)

    @property
    def hidden(self) -> bool | None:
        """Copies hidden behind compute (waits under 5% of the copy time); None before any measured forward."""
        if not self.forwards or self.copy_ms <= 0:
            return None
        return self.wait_ms <= 0.05 * self.copy_ms

    def as_dict(self) -> dict:
        return {
            "forwards": self.forwards,
            "gib_per_forward": round(self.bytes_per_forward / GIB, 3),
            "copy_ms_per_forward": round(self.copy_ms, 2),
            "wait_ms_per_forward": round(self.wait_ms, 2),
            "hidden": self.hidden,
            "pageable_tensors": self.pageable,
            "mispredicted": self.mispredicted,
        }


class BlockStreamer:
    """Streams ``units`` (pieces of blocks, in forward order) through ``slots`` reused device buffers, on a copy
    stream of its own.

    Call ``before(index, piece)`` when a piece of block ``index`` starts (``hook_pieces`` does) and ``after(index,
    piece)`` when the block's last piece returned. Both are cheap on the host: device work is ordered by events,
    never by a synchronization. On a CPU device the copies run in place (same order, no streams): the plan and the
    bindings can be tested without a GPU."""

    def __init__(self, units: Sequence[StreamUnit], device: torch.device, slots: int, slot_bytes: int):
        if not units:
            raise ValueError("BlockStreamer needs at least one unit")
        self.units = list(units)
        self.order = {u.key: k for k, u in enumerate(self.units)}
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.slots = max(1, min(int(slots), len(self.units)))
        self.slot_bytes = int(slot_bytes)
        if any(u.nbytes > self.slot_bytes for u in self.units):
            raise ValueError("a streamed unit is larger than a slot")
        self.buffers = [torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device) for _ in range(self.slots)]
        self.views = [[self._views(u, buf) for buf in self.buffers] for u in self.units]
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.freed: list = [None] * self.slots  # event: the slot's last occupant finished computing
        self.queue: deque = deque()  # (unit position, slot, copy-done event, timing events) queued ahead, in order
        self.next_slot = 0
        self.current: tuple | None = None
        self.stats = StreamStats(
            bytes_per_forward=sum(u.nbytes for u in self.units),
            pageable=sum(1 for u in self.units for p in u.pinned if not p),
        )
        self._timings: list = []  # (copy start, copy end, needed) events of the forward running now
        self._pending: list = []  # those of the forward before, read once the next one ended
        # True while a forward may be captured in a CUDA graph: no copy is queued past the forward's last unit (a
        # graph must hold every copy it waits for, and no copy of the next forward may outlive it)
        self.per_pass = False
        self.copies = 0  # units copied (tests: the order of prefetch)
        # ("copy" | "use" | "free", block index, piece, slot) when tracing is on (tests: order and slots)
        self.trace: list[tuple[str, int, str, int]] = []
        self.tracing = False

    # -- layout -----------------------------------------------------------------------------------------------------
    @staticmethod
    def _views(unit: StreamUnit, buf: torch.Tensor) -> list[torch.Tensor]:
        out, offset = [], 0
        for t in unit.host:
            nbytes = t.numel() * t.element_size()
            out.append(buf[offset : offset + nbytes].view(t.dtype).view(t.shape))
            offset += aligned(nbytes)
        return out

    # -- the protocol ------------------------------------------------------------------------------------------------
    def before(self, index: int, piece: str = WHOLE) -> None:
        """Piece ``piece`` of block ``index`` starts: release the unit bound before it, make the compute stream wait
        for this one's weights, bind them, queue the next copies.

        Releasing the previous unit here is the normal protocol, not a repair: a block's pieces follow each other
        with no hook in between (w1 and w3 may not have one), so the piece bound before (the previous piece of this
        block, or the last piece of a block whose release hook did not run because it raised) is released when the
        next one is bound. Its kernels are queued on the compute stream by then, so its slot is free once the event
        recorded now has passed."""
        pos = self.order[(index, piece)]
        capturing = self.cuda and torch.cuda.is_current_stream_capturing()
        if self.current is not None:
            self._release()
        if self.per_pass and pos == 0:  # a forward of its own: nothing queued by the one before is waited for, and
            self.queue.clear()  # every unit takes the same slot in every forward (what a capture saw, eager ones see)
            self.next_slot = 0
        if self.queue and self.queue[0][0] == pos:
            entry = self.queue.popleft()
        else:  # not queued ahead (first forward, or an order the prediction missed): copy now, predict afresh
            if self.copies and self.slots > 1 and (self.queue or pos != 0):  # a forward may start with none queued
                self.stats.mispredicted += 1
            self.queue.clear()
            self._fence()
            entry = self._issue(pos, capturing)
        _, slot, done, timing = entry
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)  # this device's, whichever the thread's current one is
            if timing[0] is not None:  # timed copies only (not a captured forward's)
                needed = torch.cuda.Event(enable_timing=True)
                needed.record(compute)
                self._timings.append((timing[0], timing[1], needed))
            compute.wait_event(done)
        self.units[pos].bind(self.views[pos][slot])
        self.current = (pos, slot)
        if self.tracing:
            self.trace.append(("use", index, piece, slot))
        ahead = {e[0] for e in self.queue}
        for k in range(1, self.slots):
            nxt = pos + k
            if nxt >= len(self.units):
                if self.per_pass:
                    break
                nxt %= len(self.units)
            if nxt not in ahead and nxt != pos:
                self.queue.append(self._issue(nxt, capturing))
                ahead.add(nxt)

    def after(self, index: int, piece: str = WHOLE) -> None:
        """The last piece of block ``index`` returned: release it (nothing to do if another unit is bound)."""
        if self.current is not None and self.units[self.current[0]].key == (index, piece):
            self._release()

    def _release(self) -> None:
        """The bound unit's slot is free once the work queued so far is done; its host tensors are back."""
        pos, slot = self.current
        self.current = None
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.freed[slot] = ev
        unit = self.units[pos]
        unit.unbind()
        if self.tracing:
            self.trace.append(("free", unit.index, unit.piece, slot))
        if pos == len(self.units) - 1:
            self._close_forward()

    def _fence(self) -> None:
        """Every slot is free once the compute queued so far has run: the start of a forward with nothing queued
        ahead. It also replaces the slot events of an earlier capture, which order nothing outside their graph, and
        under a capture it is what brings the copy stream into the graph."""
        if not self.cuda:
            return
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        self.freed = [ev] * self.slots

    def _issue(self, pos: int, capturing: bool = False) -> tuple:
        slot = self.next_slot
        self.next_slot = (slot + 1) % self.slots
        unit, views = self.units[pos], self.views[pos][slot]
        self.copies += 1
        if self.tracing:
            self.trace.append(("copy", unit.index, unit.piece, slot))
        if not self.cuda:
            for dst, src in zip(views, unit.host, strict=True):
                dst.copy_(src)
            return pos, slot, None, (None, None)
        timed = not capturing  # a graph's copies are not timed: their events only order the streams
        start = torch.cuda.Event(enable_timing=True) if timed else None
        end = torch.cuda.Event(enable_timing=timed)
        with torch.cuda.stream(self.copy_stream):
            if self.freed[slot] is not None:
                self.copy_stream.wait_event(self.freed[slot])
            if start is not None:
                start.record()
            for dst, src, pinned in zip(views, unit.host, unit.pinned or [False] * len(views), strict=True):
                dst.copy_(src, non_blocking=pinned)
            end.record()
        return pos, slot, end, (start, end if timed else None)

    # -- measurement -------------------------------------------------------------------------------------------------
    def _close_forward(self) -> None:
        """A forward's last streamed unit was released: read the previous forward's events (long done by now, so
        nothing waits) and keep this one's for the next time."""
        previous, self._pending, self._timings = self._pending, self._timings, []
        if self.cuda and torch.cuda.is_current_stream_capturing():  # nothing of a captured forward is timed
            self._pending = previous
            return
        if not self.cuda:
            self.stats.forwards += 1
            return
        if previous and all(e.query() for pair in previous for e in pair):
            copy = sum(s.elapsed_time(e) for s, e, _ in previous)
            wait = sum(max(0.0, n.elapsed_time(e)) for _, e, n in previous)
            n = self.stats.forwards + 1  # running means over the measured forwards
            self.stats.copy_ms += (copy - self.stats.copy_ms) / n
            self.stats.wait_ms += (wait - self.stats.wait_ms) / n
            self.stats.forwards = n

    def reset_stats(self) -> None:
        self.stats.forwards, self.stats.copy_ms, self.stats.wait_ms, self.stats.mispredicted = 0, 0.0, 0.0, 0

    def release(self) -> None:
        """The streamer is done (a new plan makes a new one): its slots leave the card now."""
        self.drain()
        self.buffers, self.views, self.freed = [], [], []
        self._timings, self._pending = [], []

    def drain(self) -> None:
        """Wait for every queued copy and forget the prediction (before the buffers go away)."""
        if self.cuda and self.copy_stream is not None:
            self.copy_stream.synchronize()
        self.queue.clear()
        if self.current is not None:
            self.units[self.current[0]].unbind()
            self.current = None


__all__ = [
    "ResidencyPlan",
    "plan_residency",
    "minimum_bytes",
    "spread",
    "BlockStreamer",
    "StreamUnit",
    "Piece",
    "block_pieces",
    "hook_pieces",
    "WHOLE",
    "mib",
    "StreamStats",
    "InsufficientVRAMError",
    "aligned",
]
