"""bench/kernel_table.py: per-kernel tables of a profiled step and their difference (CPU profiler here)."""

from __future__ import annotations

import json

import torch
from comfyui_ideogram4_int8.bench import kernel_table
from torch.profiler import ProfilerActivity, profile


def test_normalize_folds_templates_and_numbers():
    assert kernel_table.normalize("void gemm<128, std::pair<int, 4>>_kernel_12(x)") == "void gemm<>_kernel_#(x)"
    assert len(kernel_table.normalize("k" * 300)) == 140


def test_table_counts_per_step_and_diff_orders_by_difference():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            torch.mm(a, b)
            torch.relu(a)
    t = kernel_table.table(prof, steps=2, device=False)
    assert t["aten::mm"]["count"] == 2 and t["aten::relu"]["count"] == 2
    assert t["aten::mm"]["ms"] > 0
    # far above any CPU hiccup of the other ops (a first relu once took > 5 ms and outranked mm)
    other = {"aten::mm": {"count": 2, "ms": t["aten::mm"]["ms"] + 1000.0}, "extra_copy": {"count": 1, "ms": 1.0}}
    rows = kernel_table.diff(t, other)
    assert rows[0][0] == "aten::mm" and rows[0][5] == round(other["aten::mm"]["ms"] - t["aten::mm"]["ms"], 4)
    assert ("extra_copy", 0, 0.0, 1, 1.0, 1.0) in rows  # runs on one side only
    relu = next(r for r in rows if r[0] == "aten::relu")
    assert relu[3] == 0 and relu[5] < 0


def test_cli_reads_tables_from_json_paths(tmp_path, capsys):
    ref = {"paths": {"triton-int8": {"kernels": {"gemm": {"count": 2, "ms": 3.0}}}}}
    comfy = {"runs": {"ours@resident": {"kernels": {"gemm": {"count": 2, "ms": 3.5}, "copy": {"count": 9, "ms": 1}}}}}
    (tmp_path / "r.json").write_text(json.dumps(ref))
    (tmp_path / "c.json").write_text(json.dumps(comfy))
    kernel_table.main([f"{tmp_path}/r.json:paths/triton-int8", f"{tmp_path}/c.json:runs/ours@resident"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    # results written before the profile entry existed still render, and say their steps are not known
    assert (
        lines[0] == "A = paths/triton-int8: 3.0 ms of kernels per step (profiled steps not recorded: an older result)"
    )
    assert lines[1].startswith("B = runs/ours@resident: 4.5 ms of kernels per step (profiled steps not recorded")
    assert lines[3].startswith("copy") and lines[4].startswith("gemm")
    assert "per run" not in out


def test_cli_says_which_steps_each_table_covers_and_prints_the_once_per_run_work(tmp_path, capsys):
    ref = {"paths": {"triton-int8": {"kernels": {"gemm": {"count": 2, "ms": 3.0}}, "profile": {"step_calls": 1}}}}
    per_run = {
        "kernels": {"Memcpy HtoD (Pageable -> Device)": {"count": 1.0, "ms": 4.4}},
        "launches_ms": 4.4,
        "timing_ms": -0.25,
        "bus": {"span_ms": 430.0, "bus_busy_ms": 4.4, "bus_idle_ms": 425.6, "compute_busy_ms": 2.0},
    }
    per_run["bus"].update(both_idle_ms=427.0, gaps=[[427.5, 14.6, "none", "cudaMalloc", "before"]])
    comfy = {"kernels": {"gemm": {"count": 2, "ms": 3.5}}, "profile": {"steps": [8, 11], "run_steps": 20}}
    comfy["per_run"] = per_run
    (tmp_path / "r.json").write_text(json.dumps(ref))
    (tmp_path / "c.json").write_text(json.dumps({"runs": {"ours@resident": comfy}}))
    kernel_table.main([f"{tmp_path}/r.json:paths/triton-int8", f"{tmp_path}/c.json:runs/ours@resident"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "A = paths/triton-int8: 3.0 ms of kernels per step (1 bare step call)"
    assert lines[1] == "B = runs/ours@resident: 3.5 ms of kernels per step (steps 8-11 of a 20-step run)"
    assert lines[3].startswith("gemm") and "Memcpy" not in lines[3]  # the copy is no per-step row
    at = lines.index(next(ln for ln in lines if ln.startswith("B per run")))
    assert "beyond 20 x its per-step table: 4.400 ms in launches" in lines[at] and "-0.250 ms" in lines[at]
    assert lines[at + 2].startswith("Memcpy HtoD (Pageable -> Device)") and lines[at + 2].split()[-2:] == [
        "+1",
        "+4.400",
    ]
    assert "span +430.00 ms" in lines[at + 3] and "neither +427.00" in lines[at + 3]
    assert (
        "427.5 ms in the part before the profiled steps, 14.6 ms in, while none ran, the host in cudaMalloc"
        in (lines[at + 4])
    )
    assert not any(ln.startswith("A per run") for ln in lines)  # a bare step call has no run around it


def test_coverage_names_one_step_and_several():
    assert kernel_table.coverage({"steps": [1, 1], "run_steps": 2}) == "step 1 of a 2-step run"
    assert kernel_table.coverage({"step_calls": 3}) == "3 bare step calls"
    assert kernel_table.coverage(None).startswith("profiled steps not recorded")


def test_beyond_steps_counts_once_per_run_launches_apart_from_the_steps():
    # a 10-step run, steps 4-5 profiled: a GEMM 3 times a step, 2.0 ms each step (2.5 in the slow first step), a
    # quantizer on 2 of every 4 steps, and a copy once per run that a step-only rate must not absorb
    profiled = {"gemm": {"count": 6, "ms": 4.0}, "quant": {"count": 1, "ms": 0.2}}
    run = {
        "gemm": {"count": 30, "ms": 20.5},
        "quant": {"count": 5, "ms": 1.0},
        "Memcpy HtoD (Pageable -> Device)": {"count": 1, "ms": 4.4},
    }
    out = kernel_table.beyond_steps(run, profiled, profiled_steps=2, run_steps=10)
    assert out["kernels"] == {"Memcpy HtoD (Pageable -> Device)": {"count": 1.0, "ms": 4.4}}
    assert out["launches_ms"] == 4.4
    assert out["timing_ms"] == 0.5  # the slow first step's GEMM time; the quantizer matches its rate
    # a kernel the profiled steps ran more often than the run's average shows with fewer launches
    fewer = kernel_table.beyond_steps({"k": {"count": 2, "ms": 1.0}}, {"k": {"count": 2, "ms": 1.0}}, 2, 4)
    assert fewer["kernels"] == {"k": {"count": -2.0, "ms": -1.0}}


def test_bus_beyond_takes_the_parts_outside_the_steps_less_their_steps():
    per_step = {"span_ms": 10.0, "bus_busy_ms": 8.0, "bus_idle_ms": 2.0, "compute_busy_ms": 6.0, "both_idle_ms": 0.5}
    before = dict(per_step, span_ms=500.0, bus_idle_ms=492.0, both_idle_ms=470.0, gaps=[[427.5, 1.0, "none", "x"]])
    after = dict(per_step, gaps=[[0.2, 3.0, "gemm", ""]])
    out = kernel_table.bus_beyond({"before": before, "after": after}, per_step, steps=2)
    assert out["span_ms"] == 490.0 and out["bus_busy_ms"] == 0.0 and out["bus_idle_ms"] == 490.0
    assert out["both_idle_ms"] == 469.5 and out["compute_busy_ms"] == 0.0
    assert out["gaps"] == [[427.5, 1.0, "none", "x", "before"], [0.2, 3.0, "gemm", "", "after"]]


def test_scaled_and_summed_tables():
    a, b = {"k": {"count": 4, "ms": 2.0}}, {"k": {"count": 2, "ms": 1.0}, "j": {"count": 1, "ms": 0.5}}
    assert kernel_table.summed(a, b) == {"k": {"count": 6, "ms": 3.0}, "j": {"count": 1, "ms": 0.5}}
    assert kernel_table.scaled(a, 4) == {"k": {"count": 1.0, "ms": 0.5}}


def test_bus_timeline_finds_idle_stretches_and_the_kernel_running_then():
    # two steps of 10 ms: copies busy 0-4 and 5-9 ms of each; a GEMM runs 3-8 ms; step one ends with nothing running
    timeline = []
    for step in range(2):
        t0 = step * 10_000.0
        timeline += [
            ("Memcpy HtoD (Pinned -> Device)", t0 + 0, t0 + 4_000),
            ("Memcpy HtoD (Pinned -> Device)", t0 + 5_000, t0 + 9_000),
            ("gemm_kernel_12", t0 + 3_000, t0 + 8_000),
            ("Memcpy DtoD (Device -> Device)", t0 + 8_000, t0 + 8_500),
        ]
    timeline.append(("quant_kernel", 19_000.0, 20_000.0))  # the last event closes the second step
    out = kernel_table.bus(timeline, steps=2)
    assert out["span_ms"] == 10.0
    assert out["bus_busy_ms"] == 8.0 and out["bus_idle_ms"] == 2.0
    assert out["compute_busy_ms"] == 6.0  # gemm 3-8 and the device copy 8-8.5 per step, plus 1 ms once
    assert out["both_idle_ms"] == 0.5  # 9-10 ms of step one (the device waited for the host)
    assert out["idle_at"] == {"gemm_kernel_#": 1.0, "none": 0.5, "quant_kernel": 0.5}  # 4-5 ms while the GEMM ran
    assert [g[2] for g in out["gaps"]].count("gemm_kernel_#") == 2
    assert kernel_table.bus([]) == {}
    # a host blocked in a synchronize over step one's end names the stretch of 9-10 ms
    host = [("cudaStreamSynchronize", 8_800.0, 9_900.0), ("cudaLaunchKernel", 9_950.0, 10_400.0)]
    out = kernel_table.bus(timeline, steps=2, host=host)
    gap = next(g for g in out["gaps"] if g[1] == 9.0)
    assert gap[2:] == ["none", "cudaStreamSynchronize"]
    assert out["host_blocked_ms"] == {"cudaStreamSynchronize": 0.55, "cudaLaunchKernel": 0.225}
