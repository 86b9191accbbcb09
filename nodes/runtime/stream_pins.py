"""Weights' host memory pinned for the card's copies, one weight at a time through ComfyUI.

A streaming plan pins each streamed weight's host tensor through ComfyUI's ``pin_memory`` (its budget, its book), as
``pin_ahead`` does on its worker thread for a loaded MODEL's weights before its first load. A
weight still in its checkpoint's file mapping is copied to fresh memory first and the copy pinned
(``ideogram4/host_pages.py`` says why). Pinning on several threads, or on one worker thread during the resident
upload, measured no faster in the first image (docs/performance.md, "Pinning a checkpoint's weights"); pinning
before the run begins did (docs/performance.md, "The first image"). ComfyUI's pin
book is unlocked globals; the pack's calls into it take ``BOOKKEEPING``, since a model's unpins at its collection can
run on any thread.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import comfy.model_management
import torch

from ...ideogram4 import host_pages
from ...kernels import settings

PIN_COPY = "pin-copy"  # pin-copy=off: a weight in a file mapping is pinned in place (comparisons)
BOOKKEEPING = threading.RLock()  # around the pack's calls into ComfyUI's pin book (reentrant: an unpin inside
# ComfyUI's load may reach one of this thread's)


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
    """``pinning``: the tensor pinned or tried (the copy of a file's pages, else ``data``); ``pinned``: whether
    ComfyUI pinned it; ``seconds``: the copy and the registration."""

    pinning: torch.Tensor
    pinned: bool
    seconds: float


def copies_file_pages(device) -> bool:
    """Whether a weight still in its checkpoint's file mapping is copied before it is pinned for ``device`` (pinning
    is for a GPU's copies; ``pin-copy=off`` pins it in place)."""
    return torch.device(device).type == "cuda" and settings.experiment(PIN_COPY) != "off"


def pin(job: Job, room: Callable[[int], str | None] | None = None) -> Result:
    """Copy (a file's pages) and pin through ComfyUI's ``pin_memory``. A copy that did not pin is not kept (the
    result names the weight's own data). ``room``: asked right before the registration (after the copy), with the
    bytes to pin; a reason it returns refuses the pin."""
    if getattr(comfy.model_management, "MAX_PINNED_MEMORY", 1) <= 0:  # pinning off (--disable-pinned-memory)
        return Result(job.data, False, 0.0)
    started = time.perf_counter()
    pinning = host_pages.own_copy(job.data) if job.mapped else job.data
    with BOOKKEEPING:
        refused = room is not None and room(pinning.nbytes) is not None
        pinned = bool(not refused and pinning.is_contiguous() and comfy.model_management.pin_memory(pinning))
    return Result(pinning if pinned else job.data, pinned, time.perf_counter() - started)


def unpin(pinned: list, tensors) -> None:
    """Unpin ``tensors`` through ComfyUI's ``unpin_memory``, in order, and drop them from ``pinned`` (a MODEL's list
    of the host tensors the pack pinned for it)."""
    tensors = list(tensors)
    if not tensors:
        return
    gone = {id(t) for t in tensors}
    with BOOKKEEPING:
        for t in tensors:
            comfy.model_management.unpin_memory(t)
        pinned[:] = [t for t in pinned if id(t) not in gone]


__all__ = ["BOOKKEEPING", "PIN_COPY", "Job", "Result", "copies_file_pages", "pin", "unpin"]
