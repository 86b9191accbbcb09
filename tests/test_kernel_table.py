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
    assert "3.0 ms of kernels per step" in out and "4.5 ms" in out
    lines = out.splitlines()
    assert lines[2].startswith("copy") and lines[3].startswith("gemm")


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
