"""The panel in a real ComfyUI frontend (1.49.6) in headless Chromium (marked ``comfyui``).

Needs COMFYUI_DIR (see test_status_comfyui.py), Debian's chromium (``CHROMIUM``, default
/usr/bin/chromium) and playwright-core importable by node (``NODE_PATH`` pointing at a
node_modules that has it; it is not a project dependency and no browser is ever downloaded).
Screenshots go to ``PANEL_SHOTS_DIR`` (default: pytest's tmp folder): look at them.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
from test_status_comfyui import comfyui

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "browser" / "gemm_panel_shots.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _has_playwright() -> bool:
    node = shutil.which("node")
    if not node or not pathlib.Path(CHROMIUM).exists():
        return False
    probe = subprocess.run([node, "-e", "require.resolve('playwright-core')"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.fixture
def shots(tmp_path):
    if not _has_playwright():
        pytest.skip("needs node, playwright-core on NODE_PATH and chromium")
    out = pathlib.Path(os.environ.get("PANEL_SHOTS_DIR") or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _shoot(server, out: pathlib.Path, name: str, phase: str) -> dict:
    proc = subprocess.run(
        ["node", str(SCRIPT), server.base, str(out / name), phase], capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + server.log_tail()
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [e for e in result["consoleErrors"] if "ig4i8" in e or "ideogram4" in e.lower()]
    assert not ours, ours
    return result


def test_panel_before_and_after_a_run_and_with_a_forced_fallback(tmp_path, shots):
    with comfyui(tmp_path / "auto") as server:
        idle = _shoot(server, shots, "01-idle", "idle")
        assert idle["banner"]["severity"] == "idle"
        assert "No Ideogram 4 INT8 model has run yet" in idle["banner"]["text"]
        assert idle["models"] == []

        auto = _shoot(server, shots, "02-run-auto", "run")
        assert [e[0] for e in auto["events"]] == ["load", "run"]
        assert [m["label"] for m in auto["models"]] == ["conditional", "unconditional"]
        for m in auto["models"]:  # CPU: the automatic path is cuBLAS INT8, shown as a notice
            assert "linears on cuBLAS INT8 (not fused)" in m["headline"] and m["severity"] == "notice"
            assert m["rows"] > 0  # per-layer table rows are in the DOM (open or not)
        assert any(b["text"].startswith("cuBLAS INT8 ") for b in auto["badges"]), auto["badges"]

    with comfyui(tmp_path / "dequant", env={"IDEOGRAM4_INT8_GEMM_PATH": "dequant-bf16"}) as server:
        forced = _shoot(server, shots, "03-run-forced-dequant", "run")
        assert forced["banner"]["severity"] == "warning"
        for m in forced["models"]:
            assert "dequantized to bf16 (phantom INT8)" in m["headline"] and m["severity"] == "warning"
        assert "forced: dequant-bf16" in forced["env"]
        badge = next(b for b in forced["badges"] if "dequant-bf16" in b["text"])
        assert badge["text"].startswith("⚠ ") and badge["bg"] == "#b3261e"
