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
    other = {"aten::mm": {"count": 2, "ms": t["aten::mm"]["ms"] + 5.0}, "extra_copy": {"count": 1, "ms": 1.0}}
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
