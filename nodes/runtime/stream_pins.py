"""Streamed weights' host memory pinned for the card's copies: one weight at a time, or on one worker thread while
the resident weights go to the card.

A streaming plan pins each streamed weight's host tensor through ComfyUI's ``pin_memory`` (its budget, its
bookkeeping). A weight still in its checkpoint's file mapping is copied to fresh memory first and the copy pinned
(``ideogram4/host_pages.py`` says why). The copy and the registration run in torch and the driver outside the GIL,
and the resident upload (``weight_upload.before_load``) runs on staging threads and the copy engine, so the two can
overlap: under the experiment ``pin-overlap=on`` a plan's pins run on one worker thread during that upload
(``during``). ComfyUI's pin bookkeeping (``pin_memory``, ``unpin_memory``: unlocked global counters) is not made for
concurrent callers, so the worker's pins and the pack's other pin and unpin calls in that window (the upload's
unpins, ComfyUI's load, a collected model's unpins) take turns on ``BOOKKEEPING``; another model's own unpins at its
collection are not covered. What a pin's RAM release does (``extra_ram_release``) then
runs on the worker thread; and the streamed weights' host copies are remembered after the resident ones, the reverse
of the inline order, which matters only where ``host_copies`` runs short of RAM.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import comfy.model_management
import torch

from ...ideogram4 import host_pages
from ...kernels import settings

log = logging.getLogger("comfyui_ideogram4_int8")

EXPERIMENT = "pin-overlap"
BOOKKEEPING = threading.RLock()  # around each call into ComfyUI's pin bookkeeping while a worker may pin (reentrant:
# a call inside ComfyUI's load that reaches a pin of this thread must not wait on itself)


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


def pin(job: Job) -> Result:
    """Copy (a file's pages) and pin through ComfyUI: the work of one job, on whichever thread runs it. A copy that
    did not pin is not kept (the result names the weight's own data)."""
    if getattr(comfy.model_management, "MAX_PINNED_MEMORY", 1) <= 0:  # pinning off (--disable-pinned-memory)
        return Result(job.data, False, 0.0)
    started = time.perf_counter()
    pinning = host_pages.own_copy(job.data) if job.mapped else job.data
    seconds = time.perf_counter() - started
    with BOOKKEEPING:  # the seconds leave out a wait for the lock
        started = time.perf_counter()
        pinned = bool(pinning.is_contiguous() and comfy.model_management.pin_memory(pinning))
        seconds += time.perf_counter() - started
    return Result(pinning if pinned else job.data, pinned, seconds)


def overlap_enabled(device) -> bool:
    """Whether a plan's pins run during the upload (``pin-overlap=on``, on a CUDA device: nothing pins elsewhere)."""
    return torch.device(device).type == "cuda" and settings.experiment(EXPERIMENT) == "on"


@contextlib.contextmanager
def during(jobs: list[Job], finish: Callable[[Job, Result], None]):
    """Run ``jobs`` in order on one worker thread while the ``with`` body runs; after it (also when it raised), wait
    for them and hand every result to ``finish`` on this thread, so each pinned tensor is recorded. Then the body's
    error, else the worker's, else the first ``finish`` error, is raised."""
    if not jobs:
        yield
        return
    # a worker thread starts outside inference mode: copies made in a load inside ComfyUI's sampling keep its mode
    inference = torch.is_inference_mode_enabled()
    done: list[Result] = []  # in order; a job that raised ends the list

    def work() -> None:
        with torch.inference_mode(inference):
            for job in jobs:
                done.append(pin(job))

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ideogram4-int8-pin") as pool:
        future = pool.submit(work)
        body_failed = False
        try:
            yield
        except BaseException:
            body_failed = True
            raise
        finally:
            error = future.exception()
            failures = []
            for job, result in zip(jobs, done, strict=False):
                try:
                    finish(job, result)
                except Exception as exc:  # noqa: BLE001 - the rest are recorded first
                    failures.append(exc)
            dropped = [e for e in (error, *failures) if e is not None]
            if dropped and not body_failed:
                raise dropped[0]
            for e in dropped:  # the body's error wins; these would otherwise vanish
                log.warning("ideogram4-int8: a streamed weight's pin failed during a failed load: %r", e)


__all__ = ["BOOKKEEPING", "EXPERIMENT", "Job", "Result", "during", "overlap_enabled", "pin"]
