"""The panel in a real ComfyUI frontend (1.49.6) in headless Chromium, after real runs (marked ``comfyui``).

Needs COMFYUI_DIR (see test_status_comfyui.py: the server, the tiny synthetic W8A8 file and the test pack),
Debian's chromium (``CHROMIUM``, default /usr/bin/chromium) and playwright-core importable by node (``NODE_PATH``
pointing at a node_modules that has it; it is not a project dependency and no browser is ever downloaded).

``tests/browser/gemm_panel_shots.mjs`` builds the pack's graph in the page — Ideogram 4 INT8 Loader -> Ideogram 4
Sampler -> SaveLatent, ``positive`` from the test pack's Ideogram4TestConditioning node (text features from a file,
since the 8B text encoder is not on test machines) — queues it with the loader's ``gemm_path`` on "auto", then
again forced to "dequant-bf16", and reports what the panel and the node badges showed after each run.
Screenshots go to ``PANEL_SHOTS_DIR`` (default: pytest's tmp folder): look at them.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
from browser_checks import shots_dir
from test_status_comfyui import COND, WEIGHTS, expected_layers, panel_server

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "browser" / "gemm_panel_shots.mjs"
OURS = ("Ideogram4Int8Loader", "Ideogram4Int8Sampler")


@pytest.fixture
def shots(tmp_path):
    return shots_dir(tmp_path, "PANEL_SHOTS_DIR")


def _shoot(server, out: pathlib.Path, name: str, phase: str, options: dict | None = None) -> dict:
    cmd = ["node", str(SCRIPT), server.url, str(out / name), phase]
    if options:
        cmd.append(json.dumps(options))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + server.log_tail()
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [e for e in result["consoleErrors"] if "ig4i8" in e or "ideogram4" in e.lower()]
    assert not ours, ours
    assert result["shots"] and all(pathlib.Path(p).stat().st_size > 10_000 for p in result["shots"])
    return result


def _check_run(view: dict, quant_label: str, severity: str, short: str) -> None:
    """One run as the page showed it: both models, their headline and severity, the badges of our nodes."""
    protected, top, w8a8 = expected_layers()
    total, floats = len(protected | top | w8a8), len(protected | top)
    assert [m["label"] for m in view["models"]] == ["conditional", "unconditional"]
    for m in view["models"]:
        assert m["headline"].lstrip("⚠ ").startswith(f"{m['label']}: {len(w8a8)}/{total} linears {quant_label}"), m
        assert f"· {floats} on float (protected)" in m["headline"], m  # the CPU's words (path_labels)
        assert m["severity"] == severity, m
        # the per-layer table is in the DOM (open or not): one row per linear, each on the path that ran
        assert m["rows"] == total and sorted(set(m["paths"])) == sorted({"float", short}), m
    assert [e[0] for e in view["events"][-2:]] == ["load", "run"]
    for node in OURS:  # the frontend's node-source badge first, then ours: the same numbers as each model's headline
        badge = view["badges"][node][-1]
        warn = "⚠ " if severity == "warning" else ""
        assert badge["text"] == f"{warn}{short} {len(w8a8)}/{total} in both models", (node, badge, view["models"])
    assert f'"{view["badges"][OURS[0]][-1]["text"]}"' in view["badgeNote"], view["badgeNote"]  # the panel explains it
    assert view["badges"][OURS[0]][-1] == view["badges"][OURS[1]][-1]  # same two models on both nodes


def test_panel_after_a_run_and_after_forcing_the_fallback(tmp_path, shots):
    with panel_server() as server:
        idle = _shoot(server, shots, "01-idle", "idle")
        assert idle["banner"]["severity"] == "idle"
        assert "No Ideogram 4 INT8 model has run yet" in idle["banner"]["text"]
        assert idle["models"] == []

        options = {"weights": WEIGHTS, "cond": str(server.base / COND), "steps": 2, "size": 256}
        runs = _shoot(server, shots, "02-run", "runs", options)
        auto, forced = runs["auto"], runs["forced"]
        events = [(e[0], e[2]) for e in forced["events"]]
        assert events == [("load", ["conditional", "unconditional"]), ("run", ["conditional", "unconditional"])] * 2
        loader_id, sampler_id = forced["events"][0][1], forced["events"][1][1]
        assert loader_id != sampler_id and forced["events"][2][1] == loader_id and forced["events"][3][1] == sampler_id

        # (a) the automatic path on this CPU server (the tests pin torch._int_mm): named as the CPU runs it, a notice
        _check_run(auto, "on CPU INT8 matmul (torch._int_mm)", "notice", "CPU INT8")
        assert auto["banner"]["severity"] == "notice" and "No CUDA GPU" in auto["banner"]["text"]
        for m in auto["models"]:
            # the banner says once that the fused kernel needs a CUDA GPU; a model says which CPU matmul ran and why
            assert "measured faster" in m["warning"] and "CUDA GPU" not in m["warning"], m
        for node in OURS:
            assert auto["badges"][node][-1]["bg"] == "#8a5a00", auto["badges"]
        assert "forced" not in auto["env"]

        # (b) gemm_path = dequant-bf16 on the loader: every model and badge turns to the warning style, and
        #     nothing of the first run is left (headlines, table rows, badges)
        _check_run(forced, "on CPU dequantized float32 matmul", "warning", "CPU float")
        assert forced["banner"]["severity"] == "warning" and "dequant-bf16" in forced["banner"]["text"]
        for m in forced["models"]:
            assert m["headline"].startswith("⚠ ") and "forced by path argument" in m["warning"], m
            assert "cuBLAS" not in m["headline"] + m["warning"] and "cuBLAS INT8" not in m["paths"], m
        for node in OURS:
            badge = forced["badges"][node][-1]
            assert badge["text"].startswith("⚠ CPU float ") and badge["bg"] == "#b3261e", forced["badges"]
        assert "last event: run" in forced["foot"]
