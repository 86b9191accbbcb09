"""bench/step_profile.py: the profiled steps of a run apart from its once-per-run work (CPU profiler here)."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.bench.step_profile import StepProfile, middle_steps
from torch.profiler import ProfilerActivity


def test_middle_steps_leave_the_first_and_last_steps_out():
    assert middle_steps(20) == range(8, 12)
    assert middle_steps(20, 1) == range(10, 11)
    assert middle_steps(6) == range(1, 5)
    assert middle_steps(3) == range(1, 2)
    assert middle_steps(2) == range(1, 2)  # a smoke run: the last step, the set-up and first step apart
    assert middle_steps(1) == range(0, 1)
    with pytest.raises(ValueError):
        middle_steps(0)


def _run(profile, steps=6, once_in_step=None):
    """A fake sampling run: set-up work once (cumsum), two matmuls a step, an extra op in one step, the end (tril)."""
    a = torch.randn(32, 32)
    with profile:
        torch.cumsum(a, 0)
        for i in range(steps):
            torch.mm(a, a)
            torch.mm(a, a)
            if i == once_in_step:
                torch.flip(a, [0])
            profile.step_done(i)
        torch.tril(a)


def test_per_step_table_holds_the_profiled_steps_only_and_the_run_keeps_the_rest():
    prof = StepProfile(range(2, 4), [ProfilerActivity.CPU])
    _run(prof, steps=6, once_in_step=0)
    out = prof.report()
    assert out["profile"] == {"steps": [2, 3], "run_steps": 6}
    assert sorted(prof.parts) == ["after", "before", "steps"]
    assert out["kernels"]["aten::mm"]["count"] == 2
    # the set-up, the first step's extra op and the end ran once in the run: none is a per-step row (a whole 2-step
    # run divided by 2 counted each as half a launch per step)
    for once in ("aten::cumsum", "aten::flip", "aten::tril"):
        assert once not in out["kernels"]
        assert out["per_run"]["kernels"][once]["count"] == 1
    assert "aten::mm" not in out["per_run"]["kernels"]  # 12 launches in the run: 6 steps at the profiled rate
    assert out["per_run"]["launches_ms"] > 0
    assert out["bus"] == {} and "bus" not in out["per_run"]  # no device timeline on a CPU run


def test_an_extra_op_inside_the_profiled_steps_is_counted_per_step():
    prof = StepProfile(range(2, 3), [ProfilerActivity.CPU])
    _run(prof, steps=4, once_in_step=2)
    out = prof.report()
    assert out["kernels"]["aten::flip"]["count"] == 1
    # the run had 1 where its 4 steps at that rate give 4: the table says so rather than hiding it
    assert out["per_run"]["kernels"]["aten::flip"]["count"] == -3


def test_profiling_from_the_first_step_has_no_part_before_it():
    prof = StepProfile(middle_steps(1), [ProfilerActivity.CPU])
    _run(prof, steps=1)
    out = prof.report()
    assert sorted(prof.parts) == ["after", "steps"]
    assert out["profile"] == {"steps": [0, 0], "run_steps": 1}
    assert out["kernels"]["aten::cumsum"]["count"] == 1  # the set-up shares step 0's part


def test_steps_out_of_order_or_a_run_cut_short_raise():
    prof = StepProfile(range(1, 3), [ProfilerActivity.CPU])
    with prof, pytest.raises(RuntimeError, match="step 1 reported after 0 steps"):
        prof.step_done(1)
    prof = StepProfile(range(1, 3), [ProfilerActivity.CPU])
    _run(prof, steps=2)
    with pytest.raises(RuntimeError, match="ended after 2 steps"):
        prof.report()
