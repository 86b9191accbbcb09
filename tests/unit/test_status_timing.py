"""The GEMM-path status report's timing (nodes/status_report.py): shares of the run, the switch and its notes, the
timing body's validation; its real GPU run is tests/cuda/test_status_gpu.py."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.kernels import PATHS, REGISTRY, settings
from comfyui_ideogram4_int8.nodes import status_report as status
from status_checks import clean_registry_around, load_and_run, validate

# -- timing ---------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean_registry(setting):
    yield from clean_registry_around(setting)


class StubRegistry:
    """Registry with a finished timed run (CUDA events are not available on a CPU test machine)."""

    def __init__(self, per_path, wall_ms, enabled=True):
        self._last = {"gemm_ms_per_path": per_path, "wall_ms": wall_ms}
        self.timing_enabled = enabled

    def models(self):
        return []

    def layers(self, model=None):
        return []

    def last_run(self):
        return self._last


def test_timing_shares_of_the_run(gen):
    g = torch.Generator().manual_seed(gen.initial_seed())
    ms = {p: float(torch.rand(1, generator=g)) * 100 for p in PATHS}
    wall = sum(ms.values()) * 2.5
    report = status.status_report(registry=StubRegistry(ms, wall))
    validate(report)
    last = report["timing"]["last_run"]
    for p in PATHS:
        assert last["per_path"][p]["ms"] == pytest.approx(ms[p])
        assert last["per_path"][p]["share"] == pytest.approx(ms[p] / wall)
    assert last["gemm_ms"] == pytest.approx(sum(ms.values()))
    assert last["gemm_share"] == pytest.approx(0.4)
    # no wall time (end_run without begin_run): shares are unknown, not invented
    no_wall = status.status_report(registry=StubRegistry(ms, None))
    validate(no_wall)
    assert no_wall["timing"]["last_run"]["gemm_share"] is None


def test_timing_switch_and_note(tmp_path, gen):
    report = status.status_report()
    assert report["timing"]["enabled"] is False and report["timing"]["last_run"] is None
    status.switch_timing(True, "api")
    REGISTRY.begin_run()
    load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    REGISTRY.end_run()
    report = status.status_report()
    validate(report)
    assert report["timing"]["enabled"] is True and report["timing"]["switched_by"] == "api"
    if not torch.cuda.is_available():  # CPU GEMMs are not timed: the report says so instead of 0 ms
        assert report["timing"]["last_run"] is None
        assert "not timed" in report["timing"]["note"]


@pytest.mark.parametrize(("raw", "flag"), [("1", True), ("on", True), ("0", False), ("", None), ("sometimes", None)])
def test_timing_switch_and_a_value_not_understood_in_the_notes(raw, flag, setting):
    setting(settings.GEMM_TIMING, raw)
    assert settings.gemm_timing() is flag
    notes = status.status_report()["status"]["notes"]
    assert any(settings.GEMM_TIMING in n and "not understood" in n for n in notes) == (raw == "sometimes")


def test_timing_body_validation():
    assert status.validate_timing_body({"enabled": True}) is True
    assert status.validate_timing_body({"enabled": False}) is False
    bad_bodies = [(None, "enabled"), ([], "enabled"), ({"enabled": "yes"}, "enabled"), ({"enabled": 1}, "enabled")]
    bad_bodies.append(({"enabled": True, "x": 1}, "x"))
    for body, param in bad_bodies:
        with pytest.raises(status.StatusQueryError) as err:
            status.validate_timing_body(body)
        assert err.value.parameter == param and err.value.status == 400
