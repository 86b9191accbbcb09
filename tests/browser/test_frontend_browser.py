"""The pack's frontend in two frontend builds, in headless Chromium (marked ``comfyui``).

Users update ComfyUI's frontend separately from ComfyUI (``pip install -U comfyui-frontend-package``), so the
GEMM-path panel, the node badges and the Layout Boxes editor must work both in the frontend ComfyUI 0.33 pins (1.49.6,
the one in its requirements) and in the newest ``comfyui-frontend-package`` on PyPI. The newest one is served through
ComfyUI's ``--front-end-root`` from an unpacked wheel named by ``COMFYUI_NEWEST_FRONTEND_ROOT`` (its ``static``
folder; ``.ci/comfyui-tests`` downloads and unpacks it); without that variable its test skips and says so.

* pinned frontend: ``tests/browser/frontend_check.mjs`` — the panel's sidebar tab and idle banner, then the box
  editor on a new Layout Boxes node: a box drawn with the mouse, made a text element, given text and description,
  read back from the node's ``boxes`` widget. (The panel after real runs, with the badges, is
  ``test_panel_browser.py`` on this frontend.)
* newest frontend: the same, plus ``tests/browser/gemm_panel_shots.mjs`` — the pack's graph run twice (automatic
  path, then forced to dequant-bf16) with the checks of ``test_panel_browser.py``: both models in the panel, the
  headline, severity and per-layer rows of each, the badges on the loader and sampler nodes.
Screenshots go to ``PANEL_SHOTS_DIR`` (default: pytest's tmp folder): look at them.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from browser_checks import shots_dir
from test_panel_browser import _check_run, _shoot
from test_status_comfyui import COND, WEIGHTS, panel_server
from workflow_checks import TEMPLATES

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "browser" / "frontend_check.mjs"
NEWEST_ENV = "COMFYUI_NEWEST_FRONTEND_ROOT"


def _pinned_version() -> str:
    """The frontend version ComfyUI's requirements.txt pins (1.49.6 for ComfyUI 0.33)."""
    reqs = pathlib.Path(os.environ["COMFYUI_DIR"]) / "requirements.txt"
    for line in reqs.read_text().splitlines():
        if line.startswith("comfyui-frontend-package=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{reqs} pins no comfyui-frontend-package")


def _unpacked_version(static: pathlib.Path) -> str | None:
    """The version of the unpacked wheel whose ``comfyui_frontend_package/static`` folder this is."""
    for dist in static.parent.parent.glob("comfyui_frontend_package-*.dist-info"):
        return dist.name.removeprefix("comfyui_frontend_package-").removesuffix(".dist-info")
    return None


@pytest.fixture
def shots(tmp_path):
    return shots_dir(tmp_path, "PANEL_SHOTS_DIR")


def _server(frontend_root: str | None = None):
    return panel_server(args=("--front-end-root", frontend_root) if frontend_root else ())


def _frontend_check(server, out: pathlib.Path, name: str, version: str) -> dict:
    proc = subprocess.run(
        ["node", str(SCRIPT), server.url, str(out / name)], capture_output=True, text=True, timeout=560
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + server.log_tail()
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in r, r["error"] + "\n" + server.log_tail()
    assert r["frontendVersion"] == version, r["frontendVersion"]
    assert r["vueNodes"] is False  # the classic canvas, where the pack's own editor is the box editor
    ours = [e for e in r["consoleErrors"] if "ig4i8" in e or "ideogram4" in e.lower()]
    assert not ours, ours
    # the panel's sidebar tab opens on the idle banner
    assert r["panelTab"], "no 'GEMM paths' tab in the sidebar"
    assert r["banner"]["severity"] == "idle" and "No Ideogram 4 INT8 model has run yet" in r["banner"]["text"]
    # the box editor: one box drawn from 20 % / 25 % to 70 % / 75 % of the 1024 x 1024 canvas, now a text element
    assert r["editorCanvas"]["width"] > 100 and r["editorCanvas"]["height"] > 100, r["editorCanvas"]
    assert len(r["boxes"]) == 1, r["boxes"]
    box = r["boxes"][0]
    for key, want in (("x", 0.2 * 1024), ("y", 0.25 * 1024), ("width", 0.5 * 1024), ("height", 0.5 * 1024)):
        assert abs(box[key] - want) <= 12, (key, box)
    assert box["metadata"] == {
        "type": "text",
        "text": "OPEN",
        "desc": "gold serif letters on a dark sign",
        "palette": [],
    }, box
    assert "box 1/1 · text · bbox [" in r["info"], r["info"]
    assert all(pathlib.Path(p).stat().st_size > 10_000 for p in r["shots"])
    return r


def test_panel_and_box_editor_on_the_frontend_comfyui_pins(shots):
    with _server() as server:
        _frontend_check(server, shots, "pinned-frontend", _pinned_version())


def test_panel_badges_and_box_editor_on_the_newest_frontend(shots):
    root = os.environ.get(NEWEST_ENV)
    if not root:
        pytest.skip(
            f"set {NEWEST_ENV} to the static/ folder of an unpacked comfyui-frontend-package wheel "
            "(.ci/comfyui-tests does)"
        )
    static = pathlib.Path(root)
    assert (static / "index.html").is_file(), f"{NEWEST_ENV}={root}: no index.html there"
    version = _unpacked_version(static)
    assert version and version != _pinned_version(), version
    with _server(str(static)) as server:
        _frontend_check(server, shots, "newest-frontend", version)
        runs = _shoot(
            server,
            shots,
            "newest-frontend-run",
            "runs",
            {"weights": WEIGHTS, "cond": str(server.base / COND), "steps": 2, "size": 256},
        )
    auto, forced = runs["auto"], runs["forced"]
    _check_run(auto, "on CPU INT8 matmul (torch._int_mm)", "notice", "CPU INT8")
    _check_run(forced, "on CPU dequantized float32 matmul", "warning", "CPU float")
    for node in ("Ideogram4Int8Loader", "Ideogram4Int8Sampler"):
        assert auto["badges"][node][-1]["bg"] == "#8a5a00", auto["badges"]
        assert forced["badges"][node][-1]["text"].startswith("⚠ CPU float "), forced["badges"]


NODES2_SCRIPT = ROOT / "tests" / "browser" / "nodes2_check.mjs"
EXAMPLE_FILES = sorted((ROOT / "example_workflows").glob("*.json"))


@pytest.mark.parametrize("frontend, vue", [("pinned", False), ("newest", False), ("newest", True)])
def test_sampler_custom_only_widgets_and_workflow_overlap(shots, frontend, vue):
    """The sampler's custom-only widgets hide under a named preset and show under custom (classic canvas and Nodes
    2.0); the example workflows' nodes do not overlap on screen (Nodes 2.0 sizes nodes by their DOM content)."""
    root = None
    if frontend == "newest":
        root = os.environ.get(NEWEST_ENV)
        if not root:
            pytest.skip(f"set {NEWEST_ENV} to the static/ folder of an unpacked comfyui-frontend-package wheel")
    with _server(root) as server:
        proc = subprocess.run(
            ["node", str(NODES2_SCRIPT), server.url, str(shots / f"{frontend}-vue{int(vue)}"), "1" if vue else "0"]
            + [str(p) for p in EXAMPLE_FILES],
            capture_output=True,
            text=True,
            timeout=560,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in r, r["error"]
    assert r["vueSetting"] is vue
    assert r["samplerNamed"] == [], "a named preset ignores these widgets: they must not show"
    assert r["samplerCustom"] == ["steps", "guidance", "polish_steps", "polish_guidance", "mu", "std"]
    assert sorted(r["workflows"]) == sorted(p.stem for p in EXAMPLE_FILES)
    overlaps = {name: w["overlaps"] for name, w in r["workflows"].items() if w["overlaps"]}
    assert not overlaps, overlaps
    # no dialog (1.58's first-load Templates browser) over any screenshot
    assert len(r["dialogsAtShots"]) == len(r["shots"]) and set(r["dialogsAtShots"]) == {0}, r["dialogsAtShots"]
    # the GEMM-path panel's tab opens on its idle banner, on screen
    x, y, w, h = r["panel"]["banner"]
    assert w > 100 and h > 20 and x >= 0 and y >= 0 and x + w <= r["panel"]["viewport"][0], r["panel"]
    assert "No Ideogram 4 INT8 model has run yet" in r["panel"]["text"]
    # the captions workflow's box editor: the frontend's bounding-box widget under Nodes 2.0 (the pack adds no
    # editor of its own there), the pack's editor on the classic canvas; drawn, and inside its node
    editor = r["editors"][TEMPLATES["ideogram4_captions"]]
    assert editor["packEditors"] == (0 if vue else 1), editor
    assert editor["editor"] and editor["editor"][2] > 200 and editor["editor"][3] > 200, editor
    (ex, ey, ew, eh), (nx, ny, nw, nh) = editor["editor"], editor["node"]
    assert nx - 1 <= ex and ny - 1 <= ey and ex + ew <= nx + nw + 1 and ey + eh <= ny + nh + 1, editor
    # Nodes 2.0: the widget's toolbar; classic: the pack's info line, read from the workflow's two boxes on 1024x576
    assert ("Clear all" in editor["text"]) if vue else ("2 box(es) on 1024x576" in editor["text"]), editor
