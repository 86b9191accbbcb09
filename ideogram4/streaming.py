"""Weights that do not fit the card, streamed per forward behind the compute: the residency plan and the streamer.

A DiT runs its blocks in order, every forward. When the card cannot hold every block, some blocks' big weights (the
int8 GEMM operands, and bf16 protected layers) stay in pinned host memory and cross the bus once per forward:

* ``plan_residency`` decides which blocks stay on the card and which stream, from a byte budget: the fewest blocks
  stream, spread evenly over the depth, so that every streamed block has resident compute before it to hide behind.
* ``BlockStreamer`` copies a streamed block's weights into one of a few reused device buffers (slots) on a copy
  stream, ahead of the block that needs them: when block ``u`` starts, the copies of the next ``slots - 1`` streamed
  blocks are already queued, each waiting only for its slot's previous occupant to finish computing. The compute
  stream waits for ``u``'s copy alone. Weights stay in their stored form (int8 stays int8): the kernels read the
  slot as they read a resident weight.

This module knows nothing of ComfyUI: what a unit's tensors are and how a module is pointed at a slot are callbacks
(``StreamUnit``); ``nodes/streaming_patcher.py`` wires it to ComfyUI's ModelPatcher.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

import torch

from .errors import public_error

ALIGN = 256  # bytes: every tensor in a slot starts at a multiple (the kernels' and TMA's alignment needs)
GIB = 1024**3


@public_error
class InsufficientVRAMError(RuntimeError):
    """The card cannot hold even the streaming minimum of a model (its fixed weights and its copy slots)."""


@dataclasses.dataclass(frozen=True)
class ResidencyPlan:
    """Which blocks stay on the card (``resident``) and which cross per forward (``streamed``), and the bytes."""

    resident: tuple[int, ...]
    streamed: tuple[int, ...]
    slots: int  # device buffers that streamed blocks take turns in (0 when nothing streams)
    slot_bytes: int  # one slot: the largest streamed block, aligned
    fixed_bytes: int  # weights outside the blocks on the card
    resident_bytes: int  # fixed + resident blocks' streamable weights
    streamed_bytes: int  # crossing the bus per forward
    host_bytes: int = 0  # weights outside the blocks left on the host (layers this model does not run)

    @property
    def device_bytes(self) -> int:
        """Weights plus slots on the card."""
        return self.resident_bytes + self.slots * self.slot_bytes

    def describe(self) -> str:
        if not self.streamed:
            return f"all {len(self.resident)} blocks resident ({self.resident_bytes / GIB:.2f} GiB)"
        host = f", {self.host_bytes / GIB:.2f} GiB of unused layers left on the host" if self.host_bytes else ""
        return (
            f"{len(self.resident)} blocks resident, {len(self.streamed)} streamed: "
            f"{self.device_bytes / GIB:.2f} GiB on the card ({self.slots} slots of {self.slot_bytes / 2**20:.0f} MiB), "
            f"{self.streamed_bytes / GIB:.2f} GiB from pinned host memory per forward{host}"
        )


def aligned(nbytes: int) -> int:
    return (int(nbytes) + ALIGN - 1) // ALIGN * ALIGN


def spread(count: int, total: int) -> tuple[int, ...]:
    """``count`` indices of ``range(total)`` spread evenly (the last block always among them once any stream: its
    copy has the whole forward before it)."""
    if count <= 0:
        return ()
    if count >= total:
        return tuple(range(total))
    return tuple(sorted({total - 1 - int(k * total / count) for k in range(count)}))


def minimum_bytes(block_bytes: Sequence[int], fixed_bytes: int, slots: int = 2, host_bytes: int = 0) -> int:
    """The least a model needs on the card with every block streamed."""
    return int(fixed_bytes) - int(host_bytes) + slots * max((aligned(b) for b in block_bytes), default=0)


def plan_residency(
    block_bytes: Sequence[int], fixed_bytes: int, budget: float, slots: int = 2, host_bytes: int = 0
) -> ResidencyPlan:
    """The plan that streams the fewest blocks and fits ``budget`` bytes on the card.

    ``block_bytes[i]``: the streamable bytes of block ``i`` (its big weights); ``fixed_bytes``: everything outside the
    blocks (top-level layers, norms, scales, biases); ``host_bytes``: the part of it that may stay on the host once
    anything streams (a layer the model's forwards do not run: each byte left there is one streamed byte less per
    forward).
    Raises ``InsufficientVRAMError`` naming the minimum when even streaming every block does not fit."""
    sizes = [int(b) for b in block_bytes]
    n = len(sizes)
    everything = int(fixed_bytes) + sum(sizes)
    if everything <= budget:
        return ResidencyPlan(tuple(range(n)), (), 0, 0, int(fixed_bytes), everything, 0)
    host_bytes = int(host_bytes)
    fixed_bytes = int(fixed_bytes) - host_bytes
    for count in range(1, n + 1):
        streamed = spread(count, n)
        slot = max(aligned(sizes[i]) for i in streamed)
        kept = tuple(i for i in range(n) if i not in streamed)
        resident = fixed_bytes + sum(sizes[i] for i in kept)
        if resident + slots * slot <= budget:
            return ResidencyPlan(
                kept, streamed, slots, slot, fixed_bytes, resident, sum(sizes[i] for i in streamed), host_bytes
            )
    need = minimum_bytes(sizes, fixed_bytes, slots)
    raise InsufficientVRAMError(
        f"the model needs at least {need / GIB:.2f} GiB of VRAM for its weights with every block streamed "
        f"({fixed_bytes / GIB:.2f} GiB that stays on the card + {slots} copy slots), and "
        f"{max(budget, 0) / GIB:.2f} GiB is free for it. Close other programs using the GPU, lower --reserve-vram, "
        "or run on a card with more memory"
    )


@dataclasses.dataclass
class StreamUnit:
    """One streamed block: its host tensors (pinned where possible) and how to point its modules at device copies.

    ``bind(views)`` gets one device tensor per host tensor (same shape and dtype, inside a slot); ``unbind()`` puts
    the host tensors back. ``pinned[i]`` says whether host tensor i is page-locked (asynchronous copy)."""

    index: int
    host: list[torch.Tensor]
    bind: Callable[[list[torch.Tensor]], None]
    unbind: Callable[[], None]
    pinned: list[bool] = dataclasses.field(default_factory=list)

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
    """Streams ``units`` (in forward order) through ``slots`` reused device buffers, on a copy stream of its own.

    Call ``before(index)`` when a streamed block starts and ``after(index)`` when it returned. Both are cheap on the
    host: device work is ordered by events, never by a synchronization. On a CPU device the copies run in place
    (same order, no streams): the plan and the bindings can be tested without a GPU."""

    def __init__(self, units: Sequence[StreamUnit], device: torch.device, slots: int, slot_bytes: int):
        if not units:
            raise ValueError("BlockStreamer needs at least one unit")
        self.units = list(units)
        self.order = {u.index: k for k, u in enumerate(self.units)}
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
        self.copies = 0  # units copied (tests: the order of prefetch)
        self.trace: list[tuple[str, int, int]] = []  # ("copy"|"use", unit index, slot) when tracing is on
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
    def before(self, index: int) -> None:
        """Block ``index`` starts: make the compute stream wait for its weights, bind them, queue the next copies."""
        pos = self.order[index]
        if self.current is not None:  # the last bound block never returned (an exception): free its slot first
            self.after(self.units[self.current[0]].index)
        if self.queue and self.queue[0][0] == pos:
            entry = self.queue.popleft()
        else:  # not queued ahead (first forward, or an order the prediction missed): copy now, predict afresh
            if self.copies and self.slots > 1:
                self.stats.mispredicted += 1
            self.queue.clear()
            entry = self._issue(pos)
        _, slot, done, timing = entry
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)  # this device's, whichever the thread's current one is
            needed = torch.cuda.Event(enable_timing=True)
            needed.record(compute)
            compute.wait_event(done)
            self._timings.append((timing[0], timing[1], needed))
        self.units[pos].bind(self.views[pos][slot])
        self.current = (pos, slot)
        if self.tracing:
            self.trace.append(("use", index, slot))
        ahead = {e[0] for e in self.queue}
        for k in range(1, self.slots):
            nxt = (pos + k) % len(self.units)
            if nxt not in ahead and nxt != pos:
                self.queue.append(self._issue(nxt))
                ahead.add(nxt)

    def after(self, index: int) -> None:
        """Block ``index`` returned: its slot is free once the work queued so far is done; the host tensors are back."""
        if self.current is None or self.units[self.current[0]].index != index:
            return
        pos, slot = self.current
        self.current = None
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.freed[slot] = ev
        self.units[pos].unbind()
        if pos == len(self.units) - 1:
            self._close_forward()

    def _issue(self, pos: int) -> tuple:
        slot = self.next_slot
        self.next_slot = (slot + 1) % self.slots
        unit, views = self.units[pos], self.views[pos][slot]
        self.copies += 1
        if self.tracing:
            self.trace.append(("copy", unit.index, slot))
        if not self.cuda:
            for dst, src in zip(views, unit.host, strict=True):
                dst.copy_(src)
            return pos, slot, None, (None, None)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.copy_stream):
            if self.freed[slot] is not None:
                self.copy_stream.wait_event(self.freed[slot])
            start.record()
            for dst, src, pinned in zip(views, unit.host, unit.pinned or [False] * len(views), strict=True):
                dst.copy_(src, non_blocking=pinned)
            end.record()
        return pos, slot, end, (start, end)

    # -- measurement -------------------------------------------------------------------------------------------------
    def _close_forward(self) -> None:
        """A forward's last streamed block returned: read the previous forward's events (long done by now, so
        nothing waits) and keep this one's for the next time."""
        previous, self._pending, self._timings = self._pending, self._timings, []
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
    "StreamStats",
    "InsufficientVRAMError",
    "aligned",
]
