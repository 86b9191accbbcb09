"""repair_caption: fixes only what is unambiguous, lists every change, refuses the rest with paths."""

from __future__ import annotations

import copy
import json

import pytest
from caption_fixtures import broken, examples
from comfyui_ideogram4_int8.ideogram4 import validate_caption
from comfyui_ideogram4_int8.ideogram4.captions.repair import repair_caption

EX1 = examples()[0]["caption"]
EX1_TEXT = json.dumps(EX1, ensure_ascii=False, separators=(",", ":"))
# Broken variants whose intent is clear: repair must turn them into exactly ex1.
FIXABLE = {
    "aspect_ratio_key",
    "style_key_order",
    "style_lowercase_hex",
    "text_key_order",
    "bbox_float",
    "ensure_ascii_true",
    "composition_key_order",
    "root_key_order",
    "trailing_comma",
}
BY_ID = {c["id"]: c for c in broken()}


@pytest.mark.parametrize("cid", sorted(FIXABLE))
def test_clear_cases_are_repaired_to_the_original(cid):
    result = repair_caption(BY_ID[cid]["raw"])
    assert result.ok, result.report.text()
    expected = copy.deepcopy(EX1)
    if cid == "bbox_float":  # the brief's mutation also moves the box: [500.0, 40, 960, 430]
        expected["compositional_deconstruction"]["elements"][0]["bbox"] = [500, 40, 960, 430]
    assert result.text == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
    assert result.changes, "a repair must say what it changed"


@pytest.mark.parametrize("cid", sorted(set(BY_ID) - FIXABLE - {"hex_shorthand"}))
def test_ambiguous_cases_are_refused_with_paths(cid):
    result = repair_caption(BY_ID[cid]["raw"])
    assert not result.ok and result.text is None
    assert result.report.errors
    want = {e["path"] for e in BY_ID[cid]["expect"]}
    got = {p.where for p in result.report.errors}
    assert want & got or cid == "root_list", (cid, got)


def test_shorthand_hex_is_expanded():
    result = repair_caption(BY_ID["hex_shorthand"]["raw"])
    assert result.ok
    assert json.loads(result.text)["compositional_deconstruction"]["elements"][4]["color_palette"] == ["#FFFFFF"]


def test_llm_answer_with_everything_wrong_but_clear():
    answer = (
        "Sure! Here is the caption you asked for:\n```json\n"
        '{"aspect_ratio": "16:9", "Compositional Deconstruction": {"elements": [{"desc": "neon sign", "type": "TEXT",'
        ' "text": "CAFÉ", "bbox": [100.0, "200", 300, 800], "color_palette": ["ff00aa", "#0f0",]}],'
        ' "background": "a wet street at night",}, "high_level_description": "A neon café sign.",}\n```\nEnjoy!'
    )
    result = repair_caption(answer)
    assert result.ok, result.report.text()
    assert result.text == (
        '{"high_level_description":"A neon café sign.","compositional_deconstruction":{"background":"a wet street at'
        ' night","elements":[{"type":"text","bbox":[100,200,300,800],"text":"CAFÉ","desc":"neon sign",'
        '"color_palette":["#FF00AA","#00FF00"]}]}}'
    )
    joined = "\n".join(result.changes)
    for expected in (
        "code fence",
        "trailing comma",
        "aspect_ratio",
        "renamed key",
        "'TEXT' -> 'text'",
        "bbox[0]",
        "bbox[1]",
        "color_palette[0]",
        "color_palette[1]",
        "official order",
    ):
        assert expected in joined, expected


def test_wrapper_object_from_the_hosted_endpoint_is_unwrapped():
    wrapped = json.dumps({"aspect_ratio": "4:5", "json_prompt": EX1}, ensure_ascii=False)
    result = repair_caption(wrapped)
    assert result.ok and result.text == EX1_TEXT
    as_string = json.dumps({"json_prompt": EX1_TEXT})
    assert repair_caption(as_string).text == EX1_TEXT


def test_repair_is_idempotent_and_leaves_valid_captions_alone():
    for ex in examples():
        text = json.dumps(ex["caption"], ensure_ascii=False, separators=(",", ":"))
        result = repair_caption(text)
        assert result.ok and result.text == text and result.changes == []
    fixed = repair_caption(BY_ID["root_key_order"]["raw"]).text
    again = repair_caption(fixed)
    assert again.text == fixed and again.changes == []


def test_dict_input_is_not_modified():
    cap = copy.deepcopy(EX1)
    cap["style_description"]["color_palette"][0] = "#2b1d14"
    before = copy.deepcopy(cap)
    result = repair_caption(cap)
    assert result.ok and cap == before
    assert validate_caption(result.caption) == []


def test_fractional_boxes_and_unknown_keys_are_refused():
    cap = copy.deepcopy(EX1)
    cap["compositional_deconstruction"]["elements"][0]["bbox"] = [0.1, 0.2, 0.5, 0.9]
    cap["compositional_deconstruction"]["elements"][1]["label"] = "x"
    result = repair_caption(cap)
    assert not result.ok
    paths = {p.where for p in result.report.errors}
    e = "$.compositional_deconstruction.elements"
    assert {f"{e}[0].bbox[0]", f"{e}[1].label"} <= paths


def test_plain_text_is_refused_with_a_pointer_to_the_builder():
    result = repair_caption("a cat on a sofa, golden hour")
    assert not result.ok and result.caption is None
    assert "plain text" in str(result.report.errors[0])


def test_huge_input_is_refused_not_parsed():
    from comfyui_ideogram4_int8.ideogram4.captions.limits import MAX_CAPTION_CHARS

    result = repair_caption("{" + " " * MAX_CAPTION_CHARS + "}")
    assert not result.ok and "refusing" in str(result.report.errors[0])
