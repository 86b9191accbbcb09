"""serialize_caption: official key order, compact, ensure_ascii=False, stable, refuses invalid captions."""

from __future__ import annotations

import copy
import json
import random

import pytest
from caption_fixtures import examples, load
from comfyui_ideogram4_int8.ideogram4 import serialize_caption, validate_caption
from comfyui_ideogram4_int8.ideogram4.captions import CaptionError

CASES = load("serialized.json")["cases"]


def _shuffled(value, rng):
    """The same caption with every object's keys in a random order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_serializer_matches_the_stdlib_oracle_from_any_key_order(case):
    # Oracle: stdlib json.dumps of the caption as documented (already in the official order).
    oracle = json.dumps(case["caption"], ensure_ascii=False, separators=(",", ":"))
    assert case["serialized"] == oracle
    rng = random.Random()
    for _ in range(5):
        assert serialize_caption(_shuffled(case["caption"], rng)) == oracle


@pytest.mark.parametrize("ex", examples(), ids=[e["id"] for e in examples()])
def test_serialized_caption_revalidates_and_is_stable(ex):
    cap = copy.deepcopy(ex["caption"])
    text = serialize_caption(cap)
    assert validate_caption(text) == []
    assert serialize_caption(json.loads(text)) == text  # a fixed point
    assert serialize_caption(cap) == text  # same input, same bytes
    assert cap == ex["caption"]  # input untouched
    assert "\n" not in text  # one line
    assert not text.startswith(" ") and '": ' not in text  # compact separators


def test_non_ascii_survives_literally():
    cases = {c["id"]: c for c in CASES}
    expect = {
        "ex3_photo_street_nonascii_no_palette": ["SÃO", "Pastéis", "€"],
        "ex7_3d_render_cjk_edges": ["ラーメン"],
        "tricky_strings": ["🍜", "東京", "\u2028", "é\u0301"],
    }
    for cid, chars in expect.items():
        text = serialize_caption(cases[cid]["caption"])
        for ch in chars:
            assert ch in text, (cid, ch)
        assert "\\u00" not in text.replace("\\u0001", "")  # no ensure_ascii escapes (control chars excepted)
        assert json.loads(text) == cases[cid]["caption"]
        assert text.encode("utf-8").decode("utf-8") == text


def test_text_keeps_newlines_and_spacing_verbatim():
    cap = {
        "compositional_deconstruction": {
            "background": "a wall",
            "elements": [{"desc": "sign", "text": "  OPEN\n24/7 ", "type": "text"}],
        }
    }
    text = serialize_caption(cap)
    assert '"text":"  OPEN\\n24/7 "' in text
    assert json.loads(text)["compositional_deconstruction"]["elements"][0]["text"] == "  OPEN\n24/7 "


def test_tuples_serialize_as_lists():
    cap = {
        "compositional_deconstruction": {
            "background": "a wall",
            "elements": [{"type": "obj", "bbox": (0, 0, 500, 500), "desc": "a clock"}],
        }
    }
    assert '"bbox":[0,0,500,500]' in serialize_caption(cap)


@pytest.mark.parametrize(
    "mutate, path",
    [
        (lambda c: c.update(aspect_ratio="1:1"), "$.aspect_ratio"),
        (
            lambda c: c["compositional_deconstruction"]["elements"][0].update(bbox=[0, 0, 1001, 5]),
            "$.compositional_deconstruction.elements[0].bbox[2]",
        ),
        (
            lambda c: c["compositional_deconstruction"]["elements"][0].update(bbox=[0.0, 0, 100, 5]),
            "$.compositional_deconstruction.elements[0].bbox[0]",
        ),
        (
            lambda c: c["style_description"]["color_palette"].__setitem__(0, "#abcdef"),
            "$.style_description.color_palette[0]",
        ),
    ],
)
def test_serializer_refuses_invalid_captions_naming_the_path(mutate, path):
    cap = copy.deepcopy(examples()[0]["caption"])
    mutate(cap)
    with pytest.raises(CaptionError) as info:
        serialize_caption(cap)
    assert path in str(info.value)
    assert isinstance(info.value, ValueError)


def test_serializer_rejects_non_dicts():
    with pytest.raises(CaptionError, match="expected a caption dict"):
        serialize_caption('{"compositional_deconstruction": {}}')
