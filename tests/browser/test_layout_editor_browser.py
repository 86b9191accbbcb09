"""The Layout Boxes editor (web/lib/layout_editor.mjs, attached by web/ideogram4_captions.js) in a real ComfyUI
frontend 1.49.6, headless Chromium (marked ``comfyui``; needs COMFYUI_DIR, Debian's chromium and playwright-core on
NODE_PATH, like test_panel_browser.py).

``tests/browser/layout_editor_shots.mjs`` loads the captions example, clicks its two drawn boxes and opens the
frontend's properties panel for the node. Issue 22: the editor shrank after a box was clicked, and the panel listed an
"ideogram4_layout" entry with no control. Screenshots go to ``LAYOUT_SHOTS_DIR`` (default: pytest's tmp folder).
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
from browser_checks import shots_dir
from workflow_checks import ui_file

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "browser" / "layout_editor_shots.mjs"
WORKFLOW = ui_file("ideogram4_captions")


@pytest.fixture
def shots(tmp_path):
    return shots_dir(tmp_path, "LAYOUT_SHOTS_DIR")


def test_the_box_editor_keeps_its_size_when_a_box_is_clicked_and_lists_no_stray_property(shots):
    from comfyui_server import shared_server

    srv = shared_server()
    proc = subprocess.run(
        ["node", str(SCRIPT), srv.url, f"{shots}/", str(WORKFLOW)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    before, after_text, after_obj = (r["states"][k] for k in ("before", "afterText", "afterObj"))

    # the editor fills the node's width (less the widget margin), its canvas keeps the image's 16:9 shape
    node_x, _, node_w, _ = before["nodeScreen"]
    assert abs(before["editor"][2] - (node_w - 20)) <= 2, before
    assert abs(before["canvas"][2] / before["canvas"][3] - 1024 / 576) < 0.02, before
    assert before["canvas"][2] >= 0.9 * before["editor"][2], before
    # ... and nothing moves or changes size when a box is selected, whatever its type
    for state in (after_text, after_obj):
        for part in ("nodeScreen", "editor", "stage", "canvas", "text", "desc"):
            assert state[part] == before[part], (part, before[part], state[part])
    assert before["typeButton"] == "type" and before["textValue"] == ""
    assert after_text["info"].startswith("box 1/2 · text · bbox [125, 250, 438, 750]"), after_text["info"]
    assert after_text["textValue"] == "CAFÉ\nOUVERT" and after_text["typeButton"] == "type: text"
    assert after_obj["info"].startswith("box 2/2 · obj · bbox") and after_obj["textValue"] == ""
    assert after_obj["descValue"] == "A parked red city bicycle leaning against the wall"
    assert after_obj["boxes"] == before["boxes"]  # clicking selects, it does not move or redraw a box

    # the properties panel opened and lists the node's real inputs, not the editor's DOM widget
    assert r["panelOpened"] and "Ideogram 4 Layout Boxes" in r["panelText"] and "width" in r["panelText"]
    assert r["domMentionsOurWidgets"] == [], r["domMentionsOurWidgets"]
    ours = [e for e in r["consoleErrors"] if "ideogram4" in e.lower() or "ig4i8" in e]
    assert ours == [], ours
    assert len(r["shots"]) == 4 and all(pathlib.Path(p).stat().st_size > 10_000 for p in r["shots"])
