"""Profile whole steps from the middle of a sampling run, and keep the rest of the run beside them.

A short run profiled whole and divided by its steps counts once-per-run work (the run's set-up, the conditioning's
copy to the card, a first step's capture) as if every step did it. ``StepProfile`` profiles one whole run in parts
cut at step boundaries, the sampler's per-step callback calling ``step_done``: ``before`` (the run's set-up and the
steps before the profiled ones), ``steps`` (the profiled steps) and ``after`` (the later steps and the run's end).
At each cut the device is synchronized, so no kernel of one part runs inside another part's trace (the host then
gets ahead of the device again within the first profiled step). ``report`` gives the per-step tables from ``steps``
alone and, as ``per_run``, what the whole run had beyond its steps times that per-step rate.
"""

from __future__ import annotations

import warnings

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from . import kernel_table as kt


def middle_steps(steps: int, count: int = 4) -> range:
    """The steps to profile of a run of ``steps``: ``count`` from the middle, fewer in a short run so that the first
    step stays out (from 2 steps on) and the last too (from 3 on)."""
    if steps < 1 or count < 1:
        raise ValueError(f"a run of {steps} steps, {count} of them profiled: both must be at least 1")
    n = max(1, min(count, steps - 2))
    first = (steps - n + 1) // 2
    return range(first, first + n)


class StepProfile:
    """``with StepProfile(steps): run()``, ``step_done(i)`` called after each step ``i`` (0-based) of the run;
    ``steps``: the profiled ones (``middle_steps``). ``activities``: the profiler's (CUDA: device kernels and copies;
    CPU: operators, for tests)."""

    def __init__(self, steps: range, activities=(ProfilerActivity.CUDA,)) -> None:
        if not steps:
            raise ValueError("no step to profile")
        self.steps = steps
        self.device = ProfilerActivity.CUDA in activities
        self.parts: dict[str, dict] = {}
        self.done = 0
        self._names = (["before"] if steps.start > 0 else []) + ["steps", "after"]
        self._cuts = {steps.start - 1, steps.stop - 1}  # the steps after which a part ends

        def schedule(step: int) -> ProfilerAction:  # profiler step i: the run's step i (step 0 with the set-up)
            return ProfilerAction.RECORD_AND_SAVE if step in self._cuts else ProfilerAction.RECORD

        self._prof = profile(activities=list(activities), schedule=schedule, on_trace_ready=self._keep)

    def __enter__(self) -> StepProfile:
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)

    def step_done(self, step: int) -> None:
        if step != self.done:
            raise RuntimeError(f"step {step} reported after {self.done} steps: one call per step, in order")
        self.done += 1
        if step in self._cuts and self.device:
            for i in range(torch.cuda.device_count()):  # the part's kernels end before its trace does (every card:
                torch.cuda.synchronize(i)  # a two-GPU peer's unconditional pass runs on the second)
        with warnings.catch_warnings():  # that each cycle's events go is the point: _keep reads them first
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            self._prof.step()

    def _keep(self, prof) -> None:
        name = self._names[len(self.parts)]
        self.parts[name] = {
            "kernels": kt.table(prof, device=self.device),
            "spans": kt.spans(prof),
            "host": kt.host_calls(prof),
        }

    def report(self) -> dict:
        """``profile`` (the profiled steps, first and last, and the run's steps), ``kernels`` and ``bus`` per profiled
        step, ``per_run``: ``kernel_table.beyond_steps`` with the bus's ``kernel_table.bus_beyond`` as ``bus``."""
        if self.done < self.steps.stop or "after" not in self.parts:
            raise RuntimeError(f"the run ended after {self.done} steps, before the profiled {list(self.steps)} did")
        n, run_steps = len(self.steps), self.done
        profiled = self.parts["steps"]
        out = {
            "profile": {"steps": [self.steps.start, self.steps.stop - 1], "run_steps": run_steps},
            "kernels": kt.scaled(profiled["kernels"], n),
            "bus": kt.bus(profiled["spans"], steps=n, host=profiled["host"]),
        }
        whole = kt.summed(*(p["kernels"] for p in self.parts.values()))
        out["per_run"] = kt.beyond_steps(whole, profiled["kernels"], n, run_steps)
        outside = {k: kt.bus(p["spans"], host=p["host"]) for k, p in self.parts.items() if k != "steps"}
        if out["bus"]:
            out["per_run"]["bus"] = kt.bus_beyond({k: b for k, b in outside.items() if b}, out["bus"], run_steps - n)
        return out
