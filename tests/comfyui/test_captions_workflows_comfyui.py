"""The captions example's API workflow, queued in a real ComfyUI 0.33 (``comfyui``): both previews are valid
captions, the repaired one as the layout drew it (its CPU checks: tests/unit/test_captions_workflows.py)."""

from __future__ import annotations

import json
import pathlib

import pytest
from comfyui_ideogram4_int8.ideogram4 import validate_caption

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = json.loads((ROOT / "example_workflows" / "api" / "ideogram4_captions_api.json").read_text(encoding="utf-8"))


def test_api_workflow_runs_in_comfyui():
    from comfyui_server import history_errors, shared_server

    srv = shared_server()
    entry = srv.run_prompt(API)
    assert entry["status"]["status_str"] == "success", history_errors(entry)
    previews = [entry["outputs"][k]["text"][0] for k, n in API.items() if n["class_type"] == "PreviewAny"]
    assert len(previews) == 2
    for caption in previews:
        assert validate_caption(caption) == [], caption
    repaired = json.loads(next(p for p in previews if "SALE" in p))
    assert repaired["compositional_deconstruction"]["elements"][0] == {
        "type": "text",
        "bbox": [100, 100, 300, 900],
        "text": "SALE",
        "desc": "red letters",
    }
