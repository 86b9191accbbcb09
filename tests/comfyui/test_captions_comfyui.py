"""The caption nodes inside a real ComfyUI 0.33 (skipped without COMFYUI_DIR): registration, inputs, and
caption graphs run through /prompt, including ComfyUI's own CreateBoundingBoxes feeding our nodes."""

from __future__ import annotations

import json

import pytest
from caption_fixtures import CAPTION_NODE_IDS, drawn_box

pytestmark = pytest.mark.comfyui


@pytest.fixture(scope="module")
def srv():
    from comfyui_server import shared_server

    server = shared_server()
    assert server.import_failures() == [], server.log_tail()
    return server


def _inputs(info):
    return {**info["input"].get("required", {}), **info["input"].get("optional", {})}


def test_object_info_lists_the_caption_nodes_with_their_inputs(srv):
    everything = srv.object_info()
    for node_id in CAPTION_NODE_IDS:
        info = everything[node_id]
        assert info["category"] == "Ideogram 4 INT8/captions"
        assert info["display_name"].startswith("Ideogram 4")
        for name, (_, opts) in _inputs(info).items():
            assert opts.get("tooltip"), f"{node_id}.{name} has no tooltip"
    builder = _inputs(everything["Ideogram4Int8CaptionBuilder"])
    assert builder["high_level_description"][0] == "STRING" and builder["high_level_description"][1]["multiline"]
    assert builder["style"][0] == "IDEOGRAM4_STYLE"
    assert set(builder["elements"][0].split(",")) == {"IDEOGRAM4_ELEMENTS", "ARRAY"}  # native elements accepted
    assert everything["Ideogram4Int8CaptionBuilder"]["output"] == ["STRING", "STRING"]
    layout = _inputs(everything["Ideogram4Int8LayoutBoxes"])
    assert layout["boxes"][0] == "BOUNDING_BOXES"  # the frontend's own bounding-box widget
    assert layout["width"][0] == layout["height"][0] == "INT"
    text = _inputs(everything["Ideogram4Int8TextElement"])
    assert text["y_min"][1]["max"] == 1000 and text["x_max"][1]["min"] == 0
    assert everything["Ideogram4Int8CaptionValidate"]["output"] == ["STRING", "STRING", "BOOLEAN"]
    # the native node we accept elements from is there, with the output we read
    assert "ARRAY" in everything["CreateBoundingBoxes"]["output"]


def _graph(on_invalid="error", native_desc="a plain white wall"):
    boxes = [drawn_box(0, 0, 1024, 576, desc=native_desc)]
    drawn = [
        drawn_box(256, 144, 512, 288, kind="text", desc="gold serif letters", text="CAFÉ\nOUVERT", palette=["#d4af37"])
    ]
    return {
        "1": {
            "class_type": "CreateBoundingBoxes",
            "inputs": {"width": 1024, "height": 576, "editor_state": {"__value__": boxes}},
        },
        "2": {
            "class_type": "Ideogram4Int8ObjectElement",
            "inputs": {
                "desc": "a small round table",
                "placed": True,
                "y_min": 600,
                "x_min": 100,
                "y_max": 900,
                "x_max": 400,
                "color_palette": "",
                "elements": ["1", 2],
            },
        },
        "3": {
            "class_type": "Ideogram4Int8LayoutBoxes",
            "inputs": {"width": 1024, "height": 576, "boxes": {"__value__": drawn}, "elements": ["2", 0]},
        },
        "4": {
            "class_type": "Ideogram4Int8StyleDescription",
            "inputs": {
                "kind": "photo",
                "aesthetics": "warm, inviting",
                "lighting": "evening streetlight",
                "medium": "",
                "photo": "35mm, f/2",
                "art_style": "",
                "color_palette": "#2B1D14 #d4af37",
            },
        },
        "5": {
            "class_type": "Ideogram4Int8CaptionBuilder",
            "inputs": {
                "high_level_description": "A café front at dusk.\n",
                "background": "a cobbled street",
                "on_invalid": on_invalid,
                "style": ["4", 0],
                "elements": ["3", 0],
            },
        },
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["5", 0]}},
    }


def test_caption_graph_runs_through_prompt(srv):
    entry = srv.run_prompt(_graph())
    assert entry["status"]["status_str"] == "success", entry["status"]
    caption_text = entry["outputs"]["6"]["text"][0]
    # Expected caption written out by hand, serialized with the standard library (the oracle).
    expected = {
        "high_level_description": "A café front at dusk.",
        "style_description": {
            "aesthetics": "warm, inviting",
            "lighting": "evening streetlight",
            "photo": "35mm, f/2",
            "medium": "photograph",
            "color_palette": ["#2B1D14", "#D4AF37"],
        },
        "compositional_deconstruction": {
            "background": "a cobbled street",
            "elements": [
                {"type": "obj", "bbox": [0, 0, 1000, 1000], "desc": "a plain white wall"},
                {"type": "obj", "bbox": [600, 100, 900, 400], "desc": "a small round table"},
                {
                    "type": "text",
                    "bbox": [250, 250, 750, 750],
                    "text": "CAFÉ\nOUVERT",
                    "desc": "gold serif letters",
                    "color_palette": ["#D4AF37"],
                },
            ],
        },
    }
    assert caption_text == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
    report = entry["outputs"]["5"]["text"][0]
    assert report.startswith("VALID") and "'#d4af37' -> '#D4AF37'" in report and "photograph" in report


def test_invalid_caption_stops_the_run_naming_the_path(srv):
    entry = srv.run_prompt(_graph(native_desc=""))
    assert entry["status"]["status_str"] == "error"
    from comfyui_server import history_errors

    errors = "\n".join(history_errors(entry))
    assert "$.compositional_deconstruction.elements[0].desc: is empty" in errors
    assert "[element from 'elements' input of node 2 (Ideogram 4 Object Element), item 0]" in errors
    warn = srv.run_prompt(_graph(on_invalid="warn", native_desc=""))
    assert warn["status"]["status_str"] == "success"
    assert warn["outputs"]["5"]["text"][0].startswith("INVALID")


def test_validate_repair_node_on_an_llm_answer(srv):
    answer = (
        'Here you go:\n```json\n{"aspect_ratio":"1:1","compositional_deconstruction":{"elements":[],'
        '"background":"fog over a lake",}}\n```'
    )
    prompt = {
        "1": {
            "class_type": "Ideogram4Int8CaptionValidate",
            "inputs": {"caption": answer, "mode": "repair", "on_invalid": "error"},
        },
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}},
    }
    entry = srv.run_prompt(prompt)
    assert entry["status"]["status_str"] == "success", entry["status"]
    assert (
        entry["outputs"]["2"]["text"][0] == '{"compositional_deconstruction":{"background":"fog over a lake",'
        '"elements":[]}}'
    )
    assert entry["outputs"]["3"]["text"][0] == "True"
    prompt["1"]["inputs"]["mode"] = "validate"
    failed = srv.run_prompt(prompt)
    assert failed["status"]["status_str"] == "error"


def test_caption_output_plugs_into_native_clip_text_encode(srv):
    # No text encoder is installed, so the prompt is rejected at CLIPLoader; what matters is that ComfyUI's own
    # link check accepts caption (STRING) -> CLIPTextEncode.text and reports no type mismatch anywhere.
    prompt = dict(_graph())
    prompt["7"] = {
        "class_type": "CLIPLoader",
        "inputs": {"clip_name": "qwen_3_vl_8b_missing.safetensors", "type": "ideogram4"},
    }
    prompt["8"] = {"class_type": "CLIPTextEncode", "inputs": {"text": ["5", 0], "clip": ["7", 0]}}
    prompt["9"] = {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}}
    # ComfyUI runs the valid outputs (the preview of the caption) and lists the invalid branch in node_errors.
    body = srv.post_json("/prompt", {"prompt": prompt})
    errors = json.dumps(body.get("node_errors", {}))
    assert "return_type_mismatch" not in errors
    assert "clip_name" in errors  # the only problem: the missing encoder file
    assert set(body["node_errors"]) <= {"7", "8", "9"}
    assert srv.wait_for_history(body["prompt_id"])["status"]["status_str"] == "success"
