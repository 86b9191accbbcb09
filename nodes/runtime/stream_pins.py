"""Streamed weights' host memory pinned for the card's copies: one weight at a time, or on one worker thread while
the resident weights go to the card.

A streaming plan pins each streamed weight's host tensor through ComfyUI's ``pin_memory`` (its budget, its
bookkeeping). A weight still in its checkpoint's file mapping is copied to fresh memory first and the copy pinned
(``ideogram4/host_pages.py`` says why). The copy and the registration run in torch and the driver outside the GIL,
and the resident upload runs on staging threads and the copy engine, so the two can overlap: under the experiment
``pin-overlap=on`` a plan's pins run on one worker thread during that upload (``during``). One thread, because
ComfyUI's pin bookkeeping is not made for concurrent callers; nothing else pins while the load holds the main thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from collections.abc import Callable

import comfy.model_management
import torch

from ...ideogram4 import host_pages
from ...kernels import settings

EXPERIMENT = "pin-overlap"


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
    """Copy (a file's pages) and pin through ComfyUI: the work of one job, on whichever thread runs it."""
    started = time.perf_counter()
    pinning = host_pages.own_copy(job.data) if job.mapped else job.data
    pinned = pinning.is_contiguous() and comfy.model_management.pin_memory(pinning)
    return Result(pinning, bool(pinned), time.perf_counter() - started)


def overlap_enabled(device) -> bool:
    """Whether a plan's pins run during the upload (``pin-overlap=on``, on a CUDA device: nothing pins elsewhere)."""
    return torch.device(device).type == "cuda" and settings.experiment(EXPERIMENT) == "on"


@contextlib.contextmanager
def during(jobs: list[Job], finish: Callable[[Job, Result], None]):
    """Run ``jobs`` in order on one worker thread while the ``with`` body runs; after it (also when it raised), wait
    for them and hand each result to ``finish`` on this thread, so every pinned tensor is recorded."""
    if not jobs:
        yield
        return
    # a worker thread starts outside inference mode: copies made in a load inside ComfyUI's sampling keep its mode
    inference = torch.is_inference_mode_enabled()
    done: list[Result] = []  # in order; a job that raised ends the list, and its error is raised after the rest

    def work() -> None:
        with torch.inference_mode(inference):
            for job in jobs:
                done.append(pin(job))

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ideogram4-int8-pin") as pool:
        future = pool.submit(work)
        try:
            yield
        finally:
            error = future.exception()
            for job, result in zip(jobs, done, strict=False):
                finish(job, result)
            if error is not None:
                raise error


__all__ = ["EXPERIMENT", "Job", "Result", "during", "overlap_enabled", "pin"]
