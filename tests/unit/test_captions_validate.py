"""validate_caption / check_caption: the 8 valid examples pass, every broken variant fails at the right path."""

from __future__ import annotations

import copy
import json
import random
import time

import jsonschema
import pytest
from caption_fixtures import FIXTURES, broken, examples, load
from comfyui_ideogram4_int8.ideogram4 import validate_caption
from comfyui_ideogram4_int8.ideogram4.captions import check_caption, limits
from comfyui_ideogram4_int8.ideogram4.captions.schema import schema

EXAMPLES = examples()
BROKEN = broken()


@pytest.mark.parametrize("ex", EXAMPLES, ids=[e["id"] for e in EXAMPLES])
def test_examples_are_valid(ex):
    cap = ex["caption"]
    assert validate_caption(cap) == []
    raw = json.dumps(cap, ensure_ascii=False, separators=(",", ":"))
    assert validate_caption(raw) == []
    pretty = json.dumps(cap, ensure_ascii=False, indent=2)  # whitespace is not part of the format
    assert validate_caption(pretty) == []
    jsonschema.Draft202012Validator(schema()).validate(cap)  # the shipped schema alone agrees


def test_examples_cover_the_documented_edges():
    by_id = {e["id"]: e["caption"] for e in EXAMPLES}
    assert len(by_id) == 8
    assert len(by_id["ex2_graphic_poster_16_colors"]["style_description"]["color_palette"]) == limits.MAX_STYLE_COLORS
    ex4_elements = by_id["ex4_illustration_palettes_unplaced"]["compositional_deconstruction"]["elements"]
    assert any(len(e.get("color_palette", [])) == limits.MAX_ELEMENT_COLORS for e in ex4_elements)
    assert by_id["ex5_no_style_empty_elements"]["compositional_deconstruction"]["elements"] == []
    assert list(by_id["ex6_cd_only_unplaced_text"]) == ["compositional_deconstruction"]


@pytest.mark.parametrize("case", BROKEN, ids=[c["id"] for c in BROKEN])
def test_broken_variant_fails_at_the_right_path(case):
    problems = validate_caption(case["raw"])
    assert problems, "a broken caption validated"
    report = check_caption(case["raw"], hints=False)
    got = {p.where for p in report.errors}
    want = {e["path"] for e in case["expect"]}
    assert got == want, "\n".join(problems)
    for e in case["expect"]:
        at_path = [str(p) for p in report.errors if p.where == e["path"]]
        assert any(e["contains"] in line for line in at_path), (e, at_path)
    for line in problems:  # every problem names its path and a fix
        assert line.startswith("$") and " — fix: " in line, line
        assert line.split(" — fix: ", 1)[1].strip()


def test_broken_fixture_covers_the_briefs_13_mutations_and_the_issues_bad_inputs():
    ids = {c["id"] for c in BROKEN}
    assert {
        "aspect_ratio_key",
        "style_key_order",
        "style_missing_lighting",
        "style_lowercase_hex",
        "element_six_colors",
        "text_key_order",
        "bbox_float",
        "bbox_swapped",
        "element_type_character",
        "style_photo_and_art_style",
        "obj_with_text",
        "ensure_ascii_true",
        "plain_text",
    } <= ids
    assert {"bbox_out_of_range", "element_unknown_key", "desc_wrong_type", "background_empty", "text_empty"} <= ids


def test_dict_and_text_paths_agree():
    for case in BROKEN:
        try:
            value = json.loads(case["raw"])
        except (json.JSONDecodeError, RecursionError):
            continue
        if case["id"] in ("ensure_ascii_true", "duplicate_key"):
            continue  # raw-text-only rules
        assert {p.split(":")[0] for p in validate_caption(value)} == {e["path"] for e in case["expect"]}, case["id"]


def test_validate_does_not_modify_its_input():
    cap = copy.deepcopy(EXAMPLES[0]["caption"])
    cap["compositional_deconstruction"]["elements"][0]["bbox"] = [430, 500, 40, 960]
    before = json.dumps(cap)
    validate_caption(cap)
    assert json.dumps(cap) == before


def test_several_problems_are_all_reported():
    cap = copy.deepcopy(EXAMPLES[0]["caption"])
    els = cap["compositional_deconstruction"]["elements"]
    els[0]["bbox"] = [40, 1200, 430, 960]
    els[3]["color_palette"] = ["#ffffff"]
    els[5]["extra"] = 1
    paths = {p.split(":")[0] for p in validate_caption(cap)}
    e = "$.compositional_deconstruction.elements"
    assert paths == {f"{e}[0].bbox[1]", f"{e}[0].bbox", f"{e}[3].color_palette[0]", f"{e}[5].extra"}


def test_huge_text_is_refused_unparsed_with_an_actionable_message(monkeypatch):
    from comfyui_ideogram4_int8.ideogram4.captions import rules

    raw = json.dumps(
        {"compositional_deconstruction": {"background": "x" * (limits.MAX_CAPTION_CHARS + 10), "elements": []}}
    )

    def no_parse(*a, **k):
        raise AssertionError("a caption over the limit must be refused before it is parsed")

    monkeypatch.setattr(rules.json, "loads", no_parse)
    problems = validate_caption(raw)
    monkeypatch.undo()
    assert len(problems) == 1 and problems[0].startswith("$:") and "refusing" in problems[0]


def test_many_elements_are_checked_and_the_report_stays_readable_but_counts_everything():
    el = {"type": "obj", "bbox": [10, 10, 5, 20], "desc": "a pebble"}  # each one swapped
    cap = {"compositional_deconstruction": {"background": "a beach", "elements": [dict(el) for _ in range(2000)]}}
    report = check_caption(cap)  # (its speed is not asserted: tests do not time things)
    assert len(report.errors) == 2000
    text = report.text()
    assert f"{len(report.errors)} error(s)" in text
    assert f"and {2000 - limits.MAX_REPORTED_PROBLEMS} more" in text
    assert any("elements" in str(w) and "2000 elements" in str(w) for w in report.warnings)


def test_token_budget_warning_but_still_valid():
    cap = copy.deepcopy(EXAMPLES[0]["caption"])
    cap["compositional_deconstruction"]["background"] = "word " * 2000
    raw = json.dumps(cap, ensure_ascii=False)
    report = check_caption(raw)
    assert report.ok
    assert any("tokens" in str(w) for w in report.warnings)


def test_non_string_input_types_are_reported_not_raised():
    for bad in (None, 42, 3.5, ["a"], object()):
        problems = validate_caption(bad)
        assert problems and problems[0].startswith("$"), bad
    assert "UTF-8" in check_caption(b"\xff\xfe{").errors[0].message


def test_escape_rule_ignores_escaped_backslashes_and_ascii_escapes():
    cap = {"compositional_deconstruction": {"background": "a path C:\\u00e9 and \u0041", "elements": []}}
    raw = json.dumps(cap, ensure_ascii=True)  # the text holds \\u00e9 (a literal backslash), not an escape
    assert validate_caption(raw) == []
    assert validate_caption('{"compositional_deconstruction":{"background":"\\u0041","elements":[]}}') == []
    bad = '{"compositional_deconstruction":{"background":"caf\\u00e9","elements":[]}}'
    assert "ensure_ascii" in validate_caption(bad)[0]
    mixed = '{"compositional_deconstruction":{"background":"caf\\u00e9 é","elements":[]}}'
    assert validate_caption(mixed) == []  # the official rule is silent once any literal non-ASCII appears


def test_fuzzed_captions_never_raise():
    rng = random.Random(int(time.time()))
    junk = [None, True, -1, 1.5, 1001, "", " ", "#abc", [], {}, [1, 2], {"x": 1}, "\ud800", 10**30]
    for _ in range(300):
        cap = copy.deepcopy(rng.choice(EXAMPLES)["caption"])
        for _ in range(rng.randint(1, 4)):
            node, key = _random_slot(rng, cap)
            if node is not None:
                node[key] = copy.deepcopy(rng.choice(junk))
        problems = validate_caption(cap)
        assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)


def _random_slot(rng, cap):
    node, key = None, None
    cur = cap
    while isinstance(cur, (dict, list)) and cur:
        k = rng.choice(list(cur)) if isinstance(cur, dict) else rng.randrange(len(cur))
        node, key = cur, k
        if rng.random() < 0.35:
            break
        cur = cur[k]
    return node, key


def test_schema_file_is_draft_2020_12_and_matches_the_named_limits():
    s = schema()
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["$schema"].endswith("2020-12/schema")
    d = s["$defs"]
    assert d["style"]["properties"]["color_palette"]["maxItems"] == limits.MAX_STYLE_COLORS
    assert d["element"]["properties"]["color_palette"]["maxItems"] == limits.MAX_ELEMENT_COLORS
    assert d["bbox"]["minItems"] == d["bbox"]["maxItems"] == limits.BBOX_LEN
    assert d["bbox"]["items"]["minimum"] == limits.BBOX_MIN and d["bbox"]["items"]["maximum"] == limits.BBOX_MAX
    assert d["hexColor"]["pattern"] == limits.HEX_COLOR_PATTERN
    assert d["element"]["properties"]["type"]["enum"] == list(limits.ELEMENT_TYPES)
    assert tuple(s["properties"]) == limits.ROOT_KEYS


def test_limits_match_the_shared_fixture():
    shared = load("limits.json")
    shared.pop("_comment")
    assert limits.as_dict() == shared
    assert (FIXTURES / "limits.json").is_file()


def test_bbox_edges_are_inclusive_and_min_may_equal_max():
    # The official verifier accepts 0 and 1000 and zero-width / zero-height boxes.
    els = [
        {"type": "obj", "bbox": [0, 0, 1000, 1000], "desc": "frame"},
        {"type": "obj", "bbox": [500, 500, 500, 500], "desc": "a dot"},
        {"type": "text", "bbox": [500, 10, 500, 990], "text": "—", "desc": "a rule"},
    ]
    assert validate_caption({"compositional_deconstruction": {"background": "paper", "elements": els}}) == []
    els[1]["bbox"] = [501, 500, 500, 500]
    problems = validate_caption({"compositional_deconstruction": {"background": "paper", "elements": els}})
    assert [p.split(":")[0] for p in problems] == ["$.compositional_deconstruction.elements[1].bbox"]


def test_report_lists_problems_in_document_order():
    cap = copy.deepcopy(EXAMPLES[0]["caption"])
    els = cap["compositional_deconstruction"]["elements"]
    els[4]["color_palette"] = ["#abcdef"]
    els[0]["bbox"] = [430, 500, 40, 960]
    cap["style_description"]["lighting"] = ""
    paths = [p.split(":")[0] for p in validate_caption(cap)]
    e = "$.compositional_deconstruction.elements"
    assert paths == ["$.style_description.lighting", f"{e}[0].bbox", f"{e}[4].color_palette[0]"]


def test_huge_dict_caption_is_an_error_and_long_ones_get_a_token_warning():
    big = {"compositional_deconstruction": {"background": "x " * limits.MAX_CAPTION_CHARS, "elements": []}}
    assert any(p.startswith("$: the caption is") for p in validate_caption(big))
    long = {"compositional_deconstruction": {"background": "word " * 2000, "elements": []}}
    report = check_caption(long)
    assert report.ok and any("tokens" in str(w) for w in report.warnings)
