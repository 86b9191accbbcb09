"""The example caption workflows (UI + API JSON) stay in step with the node definitions; the API one runs in a
real ComfyUI and yields a valid caption in tests/comfyui/test_captions_workflows_comfyui.py."""

from __future__ import annotations

import json
import pathlib
import re

from comfyui_ideogram4_int8.ideogram4 import validate_caption
from comfyui_ideogram4_int8.ideogram4.captions.builder import elements_from_boxes
from workflow_checks import ui_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
UI = json.loads(ui_file("ideogram4_captions").read_text(encoding="utf-8"))
API = json.loads((ROOT / "example_workflows" / "api" / "ideogram4_captions_api.json").read_text(encoding="utf-8"))
CORE_NODES = {"PreviewAny"}
FRONTEND_ONLY = {"MarkdownNote", "Note"}  # notes are never queued


def _declared_inputs() -> dict[str, set[str]]:
    """node_id -> input names, read from the node source (ComfyUI is not importable in CI)."""
    src = (ROOT / "nodes" / "caption_nodes.py").read_text()
    out: dict[str, set[str]] = {}
    for block in re.split(r"\nclass ", src)[1:]:
        m = re.search(r'node_id="(Ideogram4Int8\w+)"', block)
        if m:
            names = set(re.findall(r'\.Input\(\s*"(\w+)"', block))
            if "_bbox_inputs()" in block:
                names |= {"placed", "y_min", "x_min", "y_max", "x_max"}
            if "_chain_input(" in block:
                names.add("elements")
            if "_element_schema(" in block:  # the element nodes' shared tail: bbox, palette, chain
                names |= {"placed", "y_min", "x_min", "y_max", "x_max", "color_palette", "elements"}
            if "_on_invalid_input()" in block:
                names.add("on_invalid")
            if "STYLE_TEXTS.items()" in block:  # the style node's text widgets: the keys of that module-level table
                table = src.split("\nSTYLE_TEXTS = {\n", 1)[1].split("\n}\n", 1)[0]
                names |= set(re.findall(r'^    "(\w+)": \(', table, re.M))
            out[m.group(1)] = names
    return out


def test_api_workflow_uses_only_known_nodes_and_inputs():
    declared = _declared_inputs()
    assert len(declared) == 6
    for node_id, node in API.items():
        cls = node["class_type"]
        assert cls in declared or cls in CORE_NODES, (node_id, cls)
        if cls in declared:
            assert set(node["inputs"]) <= declared[cls], (cls, set(node["inputs"]) - declared[cls])


def test_ui_and_api_workflows_hold_the_same_nodes():
    ui_types = sorted(n["type"] for n in UI["nodes"] if n["type"] not in FRONTEND_ONLY)
    assert ui_types == sorted(n["class_type"] for n in API.values())
    layout = next(n for n in UI["nodes"] if n["type"] == "Ideogram4Int8LayoutBoxes")
    width, height, boxes = layout["widgets_values"]  # exactly the three Python inputs with widgets
    api_layout = next(n for n in API.values() if n["class_type"] == "Ideogram4Int8LayoutBoxes")
    assert api_layout["inputs"]["boxes"] == {"__value__": boxes}  # the frontend wraps list values
    elements = elements_from_boxes(boxes, width, height).elements
    cap = {"compositional_deconstruction": {"background": "y", "elements": list(elements)}}
    assert validate_caption(cap) == []
