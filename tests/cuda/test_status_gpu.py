"""The GEMM-path status report's timing of a real GPU run (nodes/status_report.py; its CPU side is
tests/unit/test_status_timing.py)."""

from __future__ import annotations

import pytest
from comfyui_ideogram4_int8.kernels import PATHS, REGISTRY
from comfyui_ideogram4_int8.nodes import status_report as status
from status_checks import clean_registry_around, load_and_run, validate

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def clean_registry(setting):
    yield from clean_registry_around(setting)


def test_timing_of_a_real_gpu_run(tmp_path, gen, setting):
    """On a GPU: CUDA-event timing between begin_run()/end_run() lands in the report per path."""
    setting.experiments("no-autotune")  # toy shapes: the heuristic, no minutes of tuning
    status.switch_timing(True, "api")
    REGISTRY.begin_run()
    load_and_run(tmp_path, gen, steps=2, device="cuda")
    REGISTRY.end_run()
    report = status.status_report()
    validate(report)
    last = report["timing"]["last_run"]
    assert last is not None, report["timing"]
    ran = {p for m in report["models"] for p in PATHS if m["counts_run"][p]}
    for p in PATHS:
        assert (last["per_path"][p]["ms"] > 0) == (p in ran), (p, last["per_path"][p])
    assert 0 < last["gemm_ms"] <= last["wall_ms"]
    assert 0 < last["gemm_share"] <= 1
    assert report["status"]["code"] == "ok" and report["environment"]["gpu"]
