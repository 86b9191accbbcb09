"""Tensors to one CUDA device fast: pageable host memory crosses through a few reused pinned staging buffers.

A ``.to(device)`` from pageable host memory is synchronous: the driver stages it through pinned memory of its own
while the calling thread waits, one tensor after the other, so the host copy and the bus take turns. ``to_device``
overlaps them:

* the bytes of the tensors that are not pinned are laid out, in order, over fills of one staging buffer each
  (``plan_fills``): a tensor larger than a buffer spans several fills, small tensors share one;
* worker threads copy each fill's bytes from the sources into its staging buffer (``Tensor.copy_`` releases the
  GIL, so several threads read host memory at once, the page cache of a memory-mapped checkpoint too);
* the calling thread queues each filled buffer's copies to the device on a copy stream of their own and records an
  event; a buffer is filled again only once that event has passed, so at most ``buffers`` fills are in flight;
* a tensor already in pinned memory is copied straight from it on the same stream.

With ``wait=False`` the calling thread does not wait for the last copies: the device's current stream waits for the
copy stream instead, so work queued next is launched while the last bytes cross. The staging buffers then go back to
torch's pinned host allocator with copies in flight; it reuses a block only once the copies recorded on it have run
(torch records them for a non-blocking copy out of its pinned memory).
Each source gets a new contiguous tensor on the device with its shape, dtype and bytes; the sources are left alone.
On a device that is not CUDA every tensor takes ``.to(device)``. ``host_twin`` runs the staged plan with host
copies on the CPU (the same plan, buffers and order; tests). The staging buffers come from torch's pinned host
allocator: freed when the call returns, its cache keeps them for the next one.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Sequence

import torch

GIB = 2**30
MIB = 2**20
BUFFERS = 4  # staging buffers: one being copied to the device while the others fill
BUFFER_BYTES = 64 * MIB
WORKERS = 4  # threads filling staging buffers
ALIGN = 256  # bytes: where a segment may start in a staging buffer


@dataclasses.dataclass(frozen=True)
class Segment:
    """``length`` bytes of tensor ``index`` from its byte ``offset``, placed at ``staging_offset`` of a buffer."""

    index: int
    offset: int
    length: int
    staging_offset: int


@dataclasses.dataclass(frozen=True)
class Fill:
    """What one staging buffer holds at once; fills take the buffers in turn (fill k: buffer k % buffers)."""

    buffer: int
    segments: tuple[Segment, ...]

    @property
    def extent(self) -> int:
        """The staging bytes this fill uses (from the buffer's start to its last segment's end)."""
        last = self.segments[-1]
        return last.staging_offset + last.length


def plan_fills(sizes: Sequence[int], buffer_bytes: int, buffers: int, align: int = ALIGN) -> list[Fill]:
    """The bytes of tensors of ``sizes`` (bytes each) laid out in order over fills of at most ``buffer_bytes``; each
    segment starts on a multiple of ``align``; a zero-size tensor has no segment."""
    if buffers < 1:
        raise ValueError(f"buffers={buffers}: at least one staging buffer is needed")
    if align < 1 or buffer_bytes < align:
        raise ValueError(f"buffer_bytes={buffer_bytes} must be at least align={align} (>= 1)")
    fills: list[Fill] = []
    segments: list[Segment] = []
    used = 0
    for index, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"sizes[{index}]={size}: a size in bytes is >= 0")
        offset = 0
        while offset < size:
            start = -(-used // align) * align
            if start >= buffer_bytes:
                fills.append(Fill(len(fills) % buffers, tuple(segments)))
                segments, start = [], 0
            length = min(size - offset, buffer_bytes - start)
            segments.append(Segment(index, offset, length, start))
            used = start + length
            offset += length
    if segments:
        fills.append(Fill(len(fills) % buffers, tuple(segments)))
    return fills


@dataclasses.dataclass(frozen=True)
class UploadReport:
    """How ``to_device`` moved its tensors. ``path``: "staged" (pinned staging buffers, or straight from pinned
    sources), "host-twin" (the staged plan with host copies) or "to" (each tensor's ``.to``, for the reason
    ``why``)."""

    path: str
    tensors: int
    nbytes: int
    seconds: float
    pinned: int = 0  # tensors copied straight from pinned host memory
    queued: bool = False  # the host did not wait for the copies (``seconds``: the time to queue them)
    fills: int = 0
    buffers: int = 0
    buffer_bytes: int = 0
    why: str = ""

    @property
    def gib_per_s(self) -> float:
        return self.nbytes / GIB / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        """One line: what went up, how long it took and how."""
        head = f"{self.nbytes / GIB:.2f} GiB in {self.tensors} tensors, {self.seconds:.2f} s"
        if self.queued:
            head += " to queue on a copy stream that the card's next work waits for"
        else:
            head += f" ({self.gib_per_s:.1f} GiB/s)"
        if self.path == "to":
            return f"{head}, each tensor's .to ({self.why})"
        kind = "pinned" if self.path == "staged" else "host (the CPU twin)"
        size = f"{self.buffer_bytes / MIB:.0f} MiB" if self.buffer_bytes >= MIB else f"{self.buffer_bytes} B"
        how = [f"through {self.buffers} x {size} {kind} staging buffers"] if self.fills else []
        if self.pinned:
            how.append(f"{self.pinned} straight from pinned memory")
        return ", ".join([head, *how])


class _CudaCopies:
    """Staging in pinned host memory; copies to ``device`` on a stream of their own; one event per buffer."""

    def __init__(self, device: torch.device, buffers: int, buffer_bytes: int):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.staging = [torch.empty(buffer_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(buffers)]
        self.events = [torch.cuda.Event() for _ in range(buffers)]

    def start(self) -> None:
        """The outputs were allocated on the caller's stream: copies wait for the work queued there (it may still
        read memory the allocator handed out again)."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def reuse(self, buffer: int) -> None:
        self.events[buffer].synchronize()

    def send(self, pairs, buffer: int | None) -> None:
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            if buffer is not None:
                self.events[buffer].record(self.stream)

    def finish(self, wait: bool = True) -> None:
        """``wait``: the host waits for the copies; otherwise the device's current stream does."""
        if wait:
            self.stream.synchronize()
        else:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)


class _HostCopies:
    """The CPU twin of ``_CudaCopies``: staging in plain host memory, each copy done when it is queued."""

    def __init__(self, device: torch.device, buffers: int, buffer_bytes: int):
        self.device = device
        self.staging = [torch.empty(buffer_bytes, dtype=torch.uint8) for _ in range(buffers)]

    def start(self) -> None:
        pass

    def reuse(self, buffer: int) -> None:
        pass

    def send(self, pairs, buffer: int | None) -> None:
        for dst, src in pairs:
            dst.copy_(src)

    def finish(self, wait: bool = True) -> None:
        pass


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


def _stageable(t: torch.Tensor) -> bool:
    """A plain strided host tensor whose bytes can be viewed as uint8."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.device.type != "cpu":
        return False
    try:
        t.new_empty(1).view(torch.uint8)
    except (RuntimeError, TypeError):
        return False
    return True


def to_device(
    tensors: Sequence[torch.Tensor],
    device,
    *,
    buffers: int = BUFFERS,
    buffer_bytes: int = BUFFER_BYTES,
    workers: int = WORKERS,
    host_twin: bool = False,
    trace: list | None = None,
    wait: bool = True,
) -> tuple[list[torch.Tensor], UploadReport]:
    """``tensors`` on ``device``: (new tensors in order, report). See the module docstring.

    ``wait``: the host waits for every copy (see the module docstring). ``host_twin``: on a CPU ``device``, run the
    staged plan with host copies (tests). ``trace``: a list that gets
    ("fill", k, buffer) when a worker starts fill k and ("sent", k, buffer) once its copies are queued."""
    device = torch.device(device)
    tensors = list(tensors)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    start = time.perf_counter()
    if host_twin and device.type != "cpu":
        raise ValueError(f"host_twin runs the staged plan on the CPU; device={device}")
    cuda = device.type == "cuda" and torch.cuda.is_available()
    if not cuda and not host_twin:
        why = "no CUDA" if device.type == "cuda" else f"a {device.type} device"
        return _each_to(tensors, device, nbytes, start, why)
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.no_grad():
        staged, pinned, direct, empty = [], [], [], []
        for i, t in enumerate(tensors):
            if not _stageable(t):
                direct.append(i)
            elif t.numel() == 0:
                empty.append(i)
            elif cuda and t.is_contiguous() and t.is_pinned():
                pinned.append(i)
            else:
                staged.append(i)
        # a non-contiguous source is made contiguous here, on the host, for the duration of the call
        sources = {i: _as_bytes(tensors[i].detach().contiguous()) for i in staged}
        fills = plan_fills([sources[i].numel() for i in staged], buffer_bytes, buffers)
        used = min(buffers, len(fills))
        size = max((f.extent for f in fills), default=0)
        copies_type = _CudaCopies if cuda else _HostCopies
        try:
            copies = copies_type(device, used, size)
        except RuntimeError as exc:  # pinned host memory refused (e.g. a locked-memory limit)
            return _each_to(tensors, device, nbytes, start, f"pinned staging memory unavailable: {exc}")
        outputs: list[torch.Tensor | None] = [None] * len(tensors)
        for i in (*staged, *pinned, *empty):
            outputs[i] = torch.empty(tensors[i].shape, dtype=tensors[i].dtype, device=device)
        for i in direct:
            outputs[i] = tensors[i].to(device)
        waits = wait or not cuda
        copies.start()
        try:
            copies.send([(outputs[i], tensors[i].detach()) for i in pinned], None)
            _run_fills(
                fills, [sources[i] for i in staged], [_as_bytes(outputs[i]) for i in staged], copies, workers, trace
            )
        finally:
            copies.finish(wait=waits)
    report = UploadReport(
        "staged" if cuda else "host-twin",
        len(tensors),
        nbytes,
        time.perf_counter() - start,
        pinned=len(pinned),
        queued=not waits,
        fills=len(fills),
        buffers=used,
        buffer_bytes=size,
    )
    return outputs, report


def _each_to(tensors, device, nbytes, start, why) -> tuple[list[torch.Tensor], UploadReport]:
    with torch.no_grad():
        out = [t.to(device) for t in tensors]
    return out, UploadReport("to", len(tensors), nbytes, time.perf_counter() - start, why=why)


def _run_fills(fills, sources, outputs, copies, workers: int, trace: list | None) -> None:
    """Fill the staging buffers on worker threads and send each filled one, in order, at most one fill per buffer
    in flight."""
    if not fills:
        return
    # a worker thread starts outside inference mode: buffers made inside it (a load in ComfyUI's sampling) are
    # inference tensors, which only inference mode may write
    inference = torch.is_inference_mode_enabled()

    def fill(k: int) -> None:
        f = fills[k]
        copies.reuse(f.buffer)  # its previous fill's copies to the device have run
        if trace is not None:
            trace.append(("fill", k, f.buffer))
        staging = copies.staging[f.buffer]
        with torch.inference_mode(inference):
            for s in f.segments:
                staging[s.staging_offset : s.staging_offset + s.length].copy_(
                    sources[s.index][s.offset : s.offset + s.length]
                )

    def send(k: int) -> None:
        f = fills[k]
        staging = copies.staging[f.buffer]
        pairs = [
            (outputs[s.index][s.offset : s.offset + s.length], staging[s.staging_offset : s.staging_offset + s.length])
            for s in f.segments
        ]
        copies.send(pairs, f.buffer)
        if trace is not None:
            trace.append(("sent", k, f.buffer))

    in_flight = len(copies.staging)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, in_flight))) as pool:
        pending: collections.deque = collections.deque()
        try:
            for k in range(len(fills)):
                if len(pending) == in_flight:  # every buffer is taken: the oldest fill goes first
                    j, done = pending.popleft()
                    done.result()
                    send(j)
                pending.append((k, pool.submit(fill, k)))
            while pending:
                j, done = pending.popleft()
                done.result()
                send(j)
        finally:
            for _, done in pending:
                done.cancel()


__all__ = ["BUFFERS", "BUFFER_BYTES", "WORKERS", "Fill", "Segment", "UploadReport", "plan_fills", "to_device"]
