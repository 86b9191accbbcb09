"""Builders: style, elements, pixel boxes (shared fixture with the JS editor), native CreateBoundingBoxes output."""

from __future__ import annotations

import json

import pytest
from caption_fixtures import drawn_box, examples, load
from comfyui_ideogram4_int8.ideogram4 import serialize_caption, validate_caption
from comfyui_ideogram4_int8.ideogram4.captions.builder import (
    ElementList,
    Where,
    bbox_widgets_problem,
    box_problem,
    build_caption,
    elements_from_boxes,
    elements_from_native,
    make_element,
    make_style,
    pixel_box_to_bbox,
)
from comfyui_ideogram4_int8.ideogram4.captions.colors import normalize_color, parse_palette

BBOX_CASES = load("bbox_cases.json")["cases"]
GEOMETRY = load("box_geometry.json")["cases"]


@pytest.mark.parametrize("case", BBOX_CASES, ids=[c["note"] for c in BBOX_CASES])
def test_pixel_box_to_grid_matches_the_hand_worked_fixture(case):
    assert pixel_box_to_bbox(case["box"], case["width"], case["height"]) == case["bbox"]


def test_rebuilding_ex1_from_builders_gives_the_documented_bytes():
    ex1 = examples()[0]["caption"]
    s, cd = ex1["style_description"], ex1["compositional_deconstruction"]
    style = make_style(
        "photo",
        s["aesthetics"],
        s["lighting"],
        s["medium"],
        photo=s["photo"],
        color_palette=", ".join(c.lower() for c in s["color_palette"]),
    )  # lowercase is fixed
    elements = ElementList()
    for el in cd["elements"]:
        elements = elements + make_element(
            el["type"], el["desc"] + "\n", el.get("text"), el.get("bbox"), " ".join(el.get("color_palette", []))
        )
    cap, notes = build_caption(ex1["high_level_description"], cd["background"], style, elements)
    assert validate_caption(cap) == []
    assert serialize_caption(cap) == json.dumps(ex1, ensure_ascii=False, separators=(",", ":"))
    assert len(notes) == len(s["color_palette"])  # each lowercase color noted, nothing else
    assert all("->" in n for n in notes)


def test_style_photo_defaults_medium_and_notes_unused_art_style():
    block = make_style("photo", "calm", "soft light", "", photo="35mm", art_style="watercolor")
    assert block.style == {"aesthetics": "calm", "lighting": "soft light", "photo": "35mm", "medium": "photograph"}
    assert any("medium" in n for n in block.notes)
    assert any("art_style text is not used" in n and "watercolor" in n for n in block.notes)
    art = make_style("art_style", "bold", "flat", "illustration", art_style="vector", color_palette="#FFF")
    assert list(art.style) == ["aesthetics", "lighting", "medium", "art_style", "color_palette"]
    assert art.style["color_palette"] == ["#FFFFFF"]
    with pytest.raises(ValueError, match="style kind"):
        make_style("painting", "a", "b", "c")


def test_empty_style_fields_are_kept_for_validation_to_report():
    block = make_style("art_style", "", "  ", "illustration", art_style="ink")
    cap, _ = build_caption("A cat.", "a room", block, None)
    problems = validate_caption(cap)
    assert {p.split(":")[0] for p in problems} == {"$.style_description.aesthetics", "$.style_description.lighting"}


def test_text_is_verbatim_desc_is_trimmed():
    el = make_element("text", "  gold letters \n", "  Café\n  Ouvert ", [0, 0, 100, 100]).elements[0]
    assert el == {"type": "text", "bbox": [0, 0, 100, 100], "text": "  Café\n  Ouvert ", "desc": "gold letters"}
    obj = make_element("obj", "a lamp", text="ignored?").elements[0]
    assert "text" not in obj and "bbox" not in obj


def test_palette_parsing_fixes_clear_cases_and_keeps_the_rest_for_validation():
    colors, notes = parse_palette("#2b1d14, FFF; #C8A27A #11223344 #aabbccff red")
    assert colors == ["#2B1D14", "#FFFFFF", "#C8A27A", "#11223344", "#AABBCC", "red"]
    assert len(notes) == 3
    assert normalize_color("#ABCDEF") == ("#ABCDEF", None)
    cap, _ = build_caption("x", "y", None, make_element("obj", "a", color_palette=colors))
    paths = {p.split(":")[0] for p in validate_caption(cap)}
    e = "$.compositional_deconstruction.elements[0].color_palette"
    assert paths == {e, f"{e}[3]", f"{e}[5]"}  # six colors (cap 5), alpha and a name: nothing dropped


def test_frontend_boxes_become_elements_in_order():
    boxes = [
        drawn_box(0, 0, 1024, 576, desc="wall", palette=["#aabbcc"]),
        drawn_box(256, 144, 512, 288, kind="text", desc="neon", text="OPEN\n"),
        {"x": 10, "y": 10, "width": 5, "height": 5},
    ]
    out = elements_from_boxes(boxes, 1024, 576, source="node 7")
    assert list(out.elements) == [
        {"type": "obj", "bbox": [0, 0, 1000, 1000], "desc": "wall", "color_palette": ["#AABBCC"]},
        {"type": "text", "bbox": [250, 250, 750, 750], "text": "OPEN\n", "desc": "neon"},
        {"type": "obj", "bbox": [17, 10, 26, 15], "desc": ""},
    ]
    assert out.sources == ("node 7 box 1", "node 7 box 2", "node 7 box 3")
    assert any("#AABBCC" in n for n in out.notes)
    cap, _ = build_caption("A shop.", "street", None, out)
    assert [p.split(":")[0] for p in validate_caption(cap)] == ["$.compositional_deconstruction.elements[2].desc"]
    with pytest.raises(ValueError, match="box 1"):
        elements_from_boxes([{"x": "a"}], 100, 100)
    with pytest.raises(ValueError, match="positive"):
        elements_from_boxes([], 0, 100)


def test_native_create_bounding_boxes_output_is_accepted():
    # The shape ComfyUI 0.33's CreateBoundingBoxes emits on its `elements` (ARRAY) output.
    native = [
        {"type": "obj", "bbox": [0, 0, 400, 1000], "desc": "sky banner", "color_palette": ["#AABBCCFF"]},
        {"type": "text", "bbox": [500, 100, 600, 900], "text": "SALE", "desc": "red letters"},
    ]
    out = elements_from_native(native)
    assert out.elements[0]["color_palette"] == ["#AABBCC"] and out.notes
    assert native[0]["color_palette"] == ["#AABBCCFF"]  # input untouched
    cap, _ = build_caption("A poster.", "white paper", None, out)
    assert validate_caption(cap) == []
    assert elements_from_native(out) is out
    with pytest.raises(ValueError, match="CreateBoundingBoxes"):
        elements_from_native({"type": "obj"})
    with pytest.raises(ValueError, match="item 1"):
        elements_from_native([{"type": "obj", "desc": "a"}, "junk"])


def test_element_lists_chain_in_order():
    a = make_element("obj", "first", source="n1")
    b = make_element("text", "second", "HI", source="n2")
    chain = a + b + elements_from_native([{"type": "obj", "desc": "third"}])
    assert [e["desc"] for e in chain.elements] == ["first", "second", "third"]
    assert len(chain) == 3 and chain.sources[:2] == ("n1", "n2")


def test_blank_high_level_description_is_omitted():
    cap, _ = build_caption("   ", "a field", None, None)
    assert list(cap) == ["compositional_deconstruction"]
    assert cap["compositional_deconstruction"] == {"background": "a field", "elements": []}


def test_text_on_an_obj_box_is_noted_not_silently_dropped():
    box = {"x": 0, "y": 0, "width": 10, "height": 10, "metadata": {"type": "obj", "text": "SALE", "desc": "a sign"}}
    out = elements_from_boxes([box], 100, 100, source="node 3")
    assert "text" not in out.elements[0]
    assert any("'SALE' is not rendered" in n for n in out.notes)


def test_report_names_where_style_and_elements_came_from():
    from comfyui_ideogram4_int8.ideogram4.captions import check_caption

    style = make_style("photo", "", "soft", "", photo="35mm", source="node 4 (style)")
    elements = make_element("obj", "", source="node 2 (object)")
    cap, notes = build_caption("A room.", "walls", style, elements)
    text = check_caption(cap).text(notes, elements.sources, style.source)
    assert "$.style_description.aesthetics: is empty" in text and "[style from node 4 (style)]" in text
    assert "[element from node 2 (object)]" in text
    assert "medium was empty; set to 'photograph'" in text


@pytest.mark.parametrize("case", GEOMETRY, ids=[c["note"] for c in GEOMETRY])
def test_drawn_boxes_with_no_area_or_off_the_canvas_are_refused_naming_the_box(case):
    problem, note = box_problem(case["box"], case["width"], case["height"])
    box = dict(case["box"], metadata={"type": "text", "text": "OPEN\n24 hours", "desc": "neon"})
    first = {"x": 0, "y": 0, "width": 10, "height": 10, "metadata": {"type": "obj", "desc": "a wall"}}
    if case["verdict"] == "refused":
        assert case["says"] in problem and note is None
        with pytest.raises(ValueError) as err:
            elements_from_boxes([first, box], case["width"], case["height"], source="node 5 (Layout Boxes)")
        assert str(err.value).startswith("node 5 (Layout Boxes), box 2 (text 'OPEN 24 hours'): ")
        assert case["says"] in str(err.value)
        return
    assert problem is None
    out = elements_from_boxes([first, box], case["width"], case["height"], source="node 5")
    assert out.elements[1]["bbox"] == case["bbox"]
    clamp_notes = [n for n in out.notes if "clamped" in n]
    if case["verdict"] == "clamped":
        assert case["says"] in note and len(clamp_notes) == 1
        assert clamp_notes[0].startswith("node 5 box 2: reached past the") and str(case["bbox"]) in clamp_notes[0]
    else:
        assert note is None and clamp_notes == []


@pytest.mark.parametrize(
    "values,says",
    [
        ((True, 100, 900, 400, 100), ["x_min=900 is greater than x_max=100", "swap"]),
        ((True, 700, 100, 300, 900), ["y_min=700 is greater than y_max=300", "top edge"]),
        ((True, 100, 500, 400, 500), ["x_min = x_max = 500", "no width"]),
        ((True, 250, 0, 250, 10), ["y_min = y_max = 250", "no height"]),
        ((True, -5, 0, 100, 100), ["y_min=-5 is off the image", "0..1000"]),
        ((True, 0, 0, 100, 1200), ["x_max=1200 is off the image"]),
        ((True, 0, 0.5, 100, 10), ["x_min=0.5 is not a whole number"]),
    ],
)
def test_element_bbox_widgets_are_checked_naming_the_widget(values, says):
    problem = bbox_widgets_problem(*values)
    for part in says:
        assert part in problem, problem
    assert bbox_widgets_problem(False, *values[1:]) is None  # unplaced: the widgets are not used
    assert bbox_widgets_problem(True, 100, 100, 400, 900) is None
    assert bbox_widgets_problem(True, None, 900, None, 100).startswith("x_min=900")  # linked values: skipped
    assert bbox_widgets_problem(True, 0, 0, 1000, 1000) is None


def test_report_names_the_node_and_widget_to_fix_not_only_a_json_path():
    from comfyui_ideogram4_int8.ideogram4.captions import check_caption

    style = make_style(
        "photo",
        "",
        "soft",
        "",
        photo="35mm",
        color_palette="#12",
        source=Where(
            "node 4 (Style)", {"aesthetics": "widget 'aesthetics'", "color_palette": "widget 'color_palette'"}
        ),
    )
    obj = make_element("obj", "", bbox=[0, 0, 10, 10], source=Where("node 2 (Object)", {"desc": "widget 'desc'"}))
    boxes = elements_from_boxes(
        [{"x": 0, "y": 0, "width": 50, "height": 50, "metadata": {"type": "text"}}],
        100,
        100,
        Where("node 6 (Boxes)", {"text": "its text field"}),
    )
    plain = make_element("obj", "", source="native item 0")
    own = Where("node 9 (Builder)", {"background": "widget 'background'"})
    cap, notes = build_caption("A room.", "", style, obj + boxes + plain)
    lines = check_caption(cap).text(notes, (obj + boxes + plain).sources, style.source, own).splitlines()
    expected = [
        "- node 4 (Style), widget 'aesthetics': is empty — fix: ",
        "- node 4 (Style), widget 'color_palette', color 1: \"#12\" is not an uppercase #RRGGBB color",
        "- node 9 (Builder), widget 'background': is empty",
        "- node 2 (Object), widget 'desc': is empty",
        "- node 6 (Boxes) box 1, its text field: is empty",
        "- $.compositional_deconstruction.elements[2].desc: is empty — fix: ",  # no place known: the JSON path
    ]
    for start in expected:
        assert sum(line.startswith(start) for line in lines) == 1, (start, lines)
    assert any(line.endswith("($.compositional_deconstruction.elements[0].desc)") for line in lines)
    assert any(line.endswith("[element from native item 0]") for line in lines)
