"""A loaded MODEL's host weights pinned on one worker thread before its first load to the card.

Between a loader and the first sampling run a workflow encodes its prompt, and the diffusion model's host memory sits
idle. ``start`` queues a loaded MODEL; one worker thread pins its large host weights through ``stream_pins.pin`` (a
weight in its checkpoint's file mapping: a pinned copy, ``ideogram4/host_pages.py``). The MODEL's first load
(``adopt``) stops the worker and puts each pinned copy in place of the weight it copies, so the resident weights cross
from pinned memory (no staging), a streaming plan finds its streamed weights pinned (``streaming_patcher``), and a
capped card's later reloads cross from pinned host copies.

* A pin ahead is made only within ComfyUI's pinned-memory budget less ``RESERVE`` (room for its own pins, a text
  encoder's) and while the host keeps the tensor plus ``host_copies.MIN_FREE_RAM`` available, checked right before
  each registration: it never makes ComfyUI evict. Under ComfyUI's RAM cache (a headroom set) none is made: its pins
  may evict cache entries, which only the executing thread may do.
* A weight changed since (a LoRA patch, a move), or one whose host copy the load would not keep (host memory short),
  keeps its own tensor; its copy is unpinned.
* Every tensor pinned here joins the MODEL's pinned list at once, so it is unpinned when the MODEL is collected.
* The pack's sampler (``during_run``) and any of its loads to a card stop the worker; at the sampler's end the pins of
  a MODEL that run did not load are released (under other samplers they wait for the MODEL's first load).
* ``pin-ahead=off``: weights are pinned only where a plan streams them (A/B).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
import weakref

import comfy.memory_management
import comfy.model_management
import psutil
import torch

from ...ideogram4 import host_pages
from ...kernels import model_notes, settings
from . import host_copies, stream_pins
from .int8_ops import site_label
from .stream_pieces import host_data, with_host_data

log = logging.getLogger("comfyui_ideogram4_int8")

EXPERIMENT = "pin-ahead"
NOTE_KIND = "pin-ahead"
GIB = 2**30
RESERVE = 8 * GIB  # of ComfyUI's pinned-memory budget, left to its own pins
MIN_BYTES = 2**20  # smaller host tensors cross in the staging buffers


def enabled() -> bool:
    return settings.experiment(EXPERIMENT) != "off"


@dataclasses.dataclass(frozen=True)
class Pinned:
    """Parameter ``name`` of ``module`` (key ``key``) had host data at ``source_ptr``; ``pinning`` is its pinned copy,
    or that data pinned in place."""

    module: torch.nn.Module
    name: str
    key: str
    source_ptr: int
    pinning: torch.Tensor


@dataclasses.dataclass(frozen=True)
class _Work:
    model: weakref.ref  # the MODEL's model: a MODEL dropped meanwhile is not pinned further
    label: str
    jobs: tuple[tuple[stream_pins.Job, str], ...]  # (job, parameter name)


_PENDING: weakref.WeakSet = weakref.WeakSet()  # models holding pins made ahead that no load has taken yet


def no_room(nbytes: int) -> str | None:
    """Why a pin of ``nbytes`` is not made ahead now, or None when it may be."""
    mm = comfy.model_management
    limit = getattr(mm, "MAX_PINNED_MEMORY", 0)
    if limit <= 0:
        return "ComfyUI pins no memory"
    if getattr(comfy.memory_management, "RAM_CACHE_HEADROOM", 0) > 0:
        return "ComfyUI's RAM cache frees host memory for pins on the executing thread"
    if getattr(mm, "TOTAL_PINNED_MEMORY", 0) + nbytes > limit - RESERVE:
        return f"ComfyUI's pinned-memory budget less {RESERVE / GIB:.0f} GiB reached"
    if psutil.virtual_memory().available < nbytes + host_copies.MIN_FREE_RAM:
        return "host memory short"
    return None


def _jobs(patcher, copies: bool) -> tuple[tuple[stream_pins.Job, str], ...]:
    """The host weights of ``patcher``'s model worth pinning (``MIN_BYTES``), unpatched, in the model's order."""
    maps = host_pages.FileMappings() if copies else None
    out = []
    for prefix, m in patcher.model.named_modules():
        for name, t in m._parameters.items():
            if t is None:
                continue
            data = host_data(t)
            key = f"{prefix}.{name}" if prefix else name
            if data.device.type != "cpu" or data.nbytes < MIN_BYTES or not data.is_contiguous():
                continue
            if data.is_pinned() or key in patcher.patches:
                continue
            out.append((stream_pins.Job(m, key, t, data, maps is not None and maps.holds(data)), name))
    return tuple(out)


class _Worker:
    """One thread pinning the queued MODELs' weights in turn until the queue is empty or ``halt``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[_Work] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, work: _Work) -> None:
        with self._lock:
            self._queue.append(work)
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="ideogram4-pin-ahead", daemon=True)
                self._thread.start()

    def halt(self) -> None:
        """Stop after the pin under way and forget the queue; returns once the thread has ended."""
        with self._lock:
            thread = self._thread
            self._stop.set()
            self._queue.clear()
        # a caller holding the pin book's lock does not wait for a worker that may be waiting for it (its pin under
        # way then lands in the MODEL's pinned list, unpinned when the MODEL is collected)
        if thread is not None and thread is not threading.current_thread() and not stream_pins.BOOKKEEPING._is_owned():
            thread.join()

    def wait(self) -> None:
        """Return once the queue is done (tests, measurements)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stop.is_set() or not self._queue:
                    self._thread = None
                    return
                work = self._queue.popleft()
            try:
                _pin_all(work, self._stop)
            except Exception as exc:  # a pin ahead is an optimisation: the load pins or stages as without it
                log.warning("ideogram4-int8: %s: pinning ahead stopped: %s", work.label, exc)


_WORKER = _Worker()


def _pin_all(work: _Work, stop: threading.Event) -> None:
    started, done, why = time.perf_counter(), 0, "all of them"
    for job, name in work.jobs:
        model = work.model()  # held through the pin: the MODEL's collection cannot run between pin and record
        if model is None:
            why = "the MODEL was dropped"
            break
        if stop.is_set():
            why = "stopped by a sampling run or a load"
            break
        short = no_room(job.data.nbytes)
        if short:
            why = short
            break
        result = stream_pins.pin(job, no_room)
        if not result.pinned:
            why = no_room(job.data.nbytes) or "ComfyUI refused a pin"
            break
        with stream_pins.BOOKKEEPING:
            model.ideogram4_pinned.append(result.pinning)
            model.ideogram4_pinned_ahead.append(Pinned(job.module, name, job.key, job.data.data_ptr(), result.pinning))
            _PENDING.add(model)
        done += result.pinning.nbytes
        del model
    total = sum(job.data.nbytes for job, _ in work.jobs)
    summary = (
        f"{done / GIB:.2f} of {total / GIB:.2f} GiB of host weights pinned ahead of the first load in "
        f"{time.perf_counter() - started:.2f} s ({why})"
    )
    model = work.model()
    if model is not None:
        model.ideogram4_pin_ahead_summary = summary
    log.info("ideogram4-int8: %s: %s", work.label, summary)


def start(patcher, *, any_device: bool = False) -> bool:
    """Queue ``patcher``'s host weights for pinning ahead; whether they were queued. Only for a MODEL loading to a
    CUDA card that ComfyUI unloads to the host with host copies kept (``any_device``: the CPU stands in, tests)."""
    device = torch.device(patcher.load_device)
    on_card = device.type == "cuda" and torch.cuda.is_available()
    if not enabled() or not (on_card or any_device) or not host_copies.enabled():
        return False
    if not host_copies.unloads_to_host(patcher) or getattr(comfy.model_management, "MAX_PINNED_MEMORY", 0) <= 0:
        return False
    if getattr(patcher.model, "ideogram4_pinned_ahead", None) is not None:  # queued already
        return False
    jobs = _jobs(patcher, stream_pins.copies_file_pages(device) or any_device)
    if not jobs:
        return False
    patcher._pinned()  # made on this thread: the worker only appends to it
    patcher.model.ideogram4_pinned_ahead = []
    label = site_label(patcher.model.diffusion_model) or "model"
    _WORKER.add(_Work(weakref.ref(patcher.model), label, jobs))
    return True


def wait() -> None:
    """Block until the queued pins are made (tests and measurements; a load stops them instead)."""
    _WORKER.wait()


def _take(model) -> list[Pinned]:
    """The model's pins made ahead that no load has taken, now the caller's (the worker has stopped)."""
    _PENDING.discard(model)
    entries = model.__dict__.get("ideogram4_pinned_ahead") or []
    model.ideogram4_pinned_ahead = []  # not None: a second start would pin them again
    return entries


def adopt(patcher) -> int:
    """Stop pinning ahead and put ``patcher``'s pinned copies in place of the weights they copy (module docstring);
    returns the bytes taken."""
    _WORKER.halt()
    entries = _take(patcher.model)
    if not entries:
        return 0
    taken, dropped = 0, []
    for e in entries:
        w = e.module._parameters.get(e.name)
        data = host_data(w) if w is not None else None
        if data is None or data.device.type != "cpu" or data.data_ptr() != e.source_ptr or e.key in patcher.patches:
            dropped.append(e.pinning)
            continue
        new = with_host_data(w, e.pinning) if e.pinning.data_ptr() != e.source_ptr else w
        if not host_copies.remember(patcher, [(e.key, new, e.pinning)]):  # kept for every later load, or not taken
            dropped.append(e.pinning)
            continue
        if new is not w:
            e.module._parameters[e.name] = torch.nn.Parameter(new, requires_grad=False)
        taken += e.pinning.nbytes
    stream_pins.unpin(patcher.model.ideogram4_pinned, dropped)
    summary = getattr(patcher.model, "ideogram4_pin_ahead_summary", "")
    note = f"{summary}; {taken / GIB:.2f} GiB taken by the first load" + (
        f", {len(dropped)} not taken (changed since, or their host copies not kept): unpinned" if dropped else ""
    )
    label = site_label(patcher.model.diffusion_model)
    if label:
        model_notes.set_note(label, NOTE_KIND, note)
    log.info("ideogram4-int8: %s: %s", label or "model", note)
    return taken


def release_untaken() -> int:
    """Unpin the pins made ahead that no load has taken (the worker stopped first); returns their bytes."""
    _WORKER.halt()
    freed = 0
    for model in list(_PENDING):
        entries = _take(model)
        stream_pins.unpin(model.ideogram4_pinned, [e.pinning for e in entries])
        freed += sum(e.pinning.nbytes for e in entries)
    return freed


@contextlib.contextmanager
def during_run():
    """Around the pack's sampling run: pinning ahead stops at its start (its copies have the bus), and what it did not
    load gives its pins back at its end."""
    _WORKER.halt()
    try:
        yield
    finally:
        freed = release_untaken()
        if freed:
            log.info("ideogram4-int8: %.2f GiB pinned ahead for MODELs this run did not load, unpinned", freed / GIB)


__all__ = [
    "EXPERIMENT",
    "MIN_BYTES",
    "NOTE_KIND",
    "RESERVE",
    "Pinned",
    "adopt",
    "during_run",
    "enabled",
    "no_room",
    "release_untaken",
    "start",
    "wait",
]
