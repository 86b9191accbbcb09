"""Streamed weights' host memory pinned for the card's copies, several weights at a time.

A streaming plan pins each streamed weight's host tensor. A weight still in its checkpoint's file mapping is copied
to fresh memory first and the copy pinned (``ideogram4/host_pages.py`` says why). ComfyUI's ``pin_memory`` registers
one tensor per call and keeps its book in unlocked globals, while the driver registers pages on several threads at
once about twice as fast (docs/performance.md, "Pinning a checkpoint's weights"). So ``pin_all`` copies and
registers on ``THREADS`` worker threads, and keeps ComfyUI's book on the calling thread: room made once for the
whole batch through ComfyUI's budget (``ensure_pin_registerable``, which may unpin other models, as ``pin_memory``
does per tensor), then each registration recorded in ``PINNED_MEMORY`` and ``TOTAL_PINNED_MEMORY``, where ComfyUI's
``unpin_memory`` finds it. A ComfyUI that keeps that book under other names, or ``pin-threads=1``, pins through
``pin_memory`` one weight at a time. The pack's calls into that book take ``BOOKKEEPING`` (a model's unpins at its
collection can run on any thread).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time

import comfy.model_management
import torch

from ...ideogram4 import host_pages
from ...kernels import settings

log = logging.getLogger("comfyui_ideogram4_int8")

EXPERIMENT = "pin-threads"
THREADS = 4  # registration runs about twice as fast on 2 to 4 threads as on 1, and slower again on 8 (docs)
BOOKKEEPING = threading.RLock()  # around the pack's calls into ComfyUI's pin book (reentrant: an unpin inside
# ComfyUI's load may reach one of this thread's)
BOOK = ("PINNED_MEMORY", "TOTAL_PINNED_MEMORY", "MAX_PINNED_MEMORY", "PINNING_ALLOWED_TYPES", "ensure_pin_registerable")
PORTABLE = 1  # cudaHostRegisterPortable, ComfyUI's flag


@dataclasses.dataclass(frozen=True)
class Job:
    """Pin ``data``, the host bytes of ``module``'s weight ``key`` (``host``); ``mapped``: they are a file's pages,
    so a copy is pinned instead."""

    module: torch.nn.Module
    key: str
    host: torch.Tensor
    data: torch.Tensor
    mapped: bool


@dataclasses.dataclass(frozen=True)
class Result:
    """``pinning``: the tensor pinned or tried (the copy of a file's pages, else ``data``); ``pinned``: whether it
    was pinned; ``seconds``: its share of the copies' and registrations' time."""

    pinning: torch.Tensor
    pinned: bool
    seconds: float


def threads() -> int:
    """How many threads register a plan's pins: ``THREADS`` (``pin-threads=1``, or a ComfyUI whose pin book
    ``pin_all`` cannot write: one), at most the host's cores."""
    if _book() is None:
        return 1
    asked = settings.experiment(EXPERIMENT)
    return max(1, min(THREADS if asked is None else int(asked), os.cpu_count() or 1))


def register(t: torch.Tensor) -> bool:
    """Register ``t``'s pages for the GPU's DMA, as ComfyUI's ``pin_memory`` does (without its book)."""
    return torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.nbytes, PORTABLE) == 0


def _book():
    """ComfyUI's model_management where it keeps its pin book under the names ``pin_all`` writes, else None."""
    mm = comfy.model_management
    if all(hasattr(mm, name) for name in BOOK) and isinstance(mm.PINNED_MEMORY, dict):
        return mm
    return None


def _pinning_off() -> bool:
    return getattr(comfy.model_management, "MAX_PINNED_MEMORY", 1) <= 0  # --disable-pinned-memory, or no GPU


def _to_pin(job: Job) -> torch.Tensor:
    return host_pages.own_copy(job.data) if job.mapped else job.data


def pin(job: Job) -> Result:
    """Copy (a file's pages) and pin through ComfyUI's ``pin_memory``: one job, on the calling thread. A copy that
    did not pin is not kept (the result names the weight's own data)."""
    if _pinning_off():
        return Result(job.data, False, 0.0)
    started = time.perf_counter()
    pinning = _to_pin(job)
    with BOOKKEEPING:
        pinned = bool(pinning.is_contiguous() and comfy.model_management.pin_memory(pinning))
    return Result(pinning if pinned else job.data, pinned, time.perf_counter() - started)


def pin_all(jobs: list[Job]) -> list[Result]:
    """Every job's result, in order (module docstring): copies and registrations on worker threads, ComfyUI's book
    on this thread. A tensor ComfyUI would not pin (not contiguous, already pinned, empty) and a registration the
    driver refuses leave their job unpinned, with ComfyUI's own warning for a refusal."""
    if not jobs:
        return []
    if _pinning_off():
        return [Result(j.data, False, 0.0) for j in jobs]
    n, book = threads(), _book()
    if n == 1:
        return [pin(j) for j in jobs]
    # worker threads start outside inference mode: copies made in a load inside ComfyUI's sampling keep its mode
    inference = torch.is_inference_mode_enabled()

    def in_mode(fn):
        def run(arg):
            with torch.inference_mode(inference):
                return fn(arg)

        return run

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="ideogram4-int8-pin") as pool:
        tensors = list(pool.map(in_mode(_to_pin), jobs))
        allowed = book.PINNING_ALLOWED_TYPES
        fit = [
            t.device.type == "cpu"
            and type(t).__name__ in allowed
            and t.is_contiguous()
            and not t.is_pinned()
            and t.data_ptr() != 0
            for t in tensors
        ]
        with BOOKKEEPING:
            release = getattr(comfy, "memory_management", None)
            if release is not None and hasattr(release, "extra_ram_release"):
                release.extra_ram_release(getattr(release, "RAM_CACHE_HEADROOM", 0))
            book.ensure_pin_registerable(sum(t.nbytes for t, ok in zip(tensors, fit, strict=True) if ok))
        done = list(pool.map(lambda i: fit[i] and _registered(tensors[i]), range(len(jobs))))
    with BOOKKEEPING:
        for t, ok in zip(tensors, done, strict=True):
            if ok:
                book.PINNED_MEMORY[t.data_ptr()] = t.nbytes
                book.TOTAL_PINNED_MEMORY += t.nbytes
    if not all(ok for ok, f in zip(done, fit, strict=True) if f):
        logging.warning("Pin error.")  # ComfyUI's words for a refused registration, once per batch
        discard = getattr(book, "discard_cuda_async_error", None)
        if discard is not None:
            discard()
    total = sum(j.data.nbytes for j in jobs) or 1
    seconds = time.perf_counter() - started
    return [
        Result(t if ok else j.data, ok, seconds * j.data.nbytes / total)
        for j, t, ok in zip(jobs, tensors, done, strict=True)
    ]


def _registered(t: torch.Tensor) -> bool:
    try:
        return register(t)
    except Exception:  # noqa: BLE001 - a registration that raised is one that did not pin (the batch warns)
        return False


__all__ = ["BOOKKEEPING", "EXPERIMENT", "THREADS", "Job", "Result", "pin", "pin_all", "register", "threads"]
