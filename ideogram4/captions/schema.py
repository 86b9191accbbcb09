"""The shipped JSON Schema (Draft 2020-12) and the translation of its errors into actionable problems."""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

from .limits import (
    BBOX_AXES,
    BBOX_MAX,
    BBOX_MIN,
    CD_KEYS,
    ELEMENT_KEYS,
    ELEMENT_TYPES,
    MAX_ELEMENT_COLORS,
    MAX_STYLE_COLORS,
    ROOT_KEYS,
    STYLE_KEYS,
)
from .problems import Problem

SCHEMA_FILE = "caption.schema.json"

_LOOSE_HEX = re.compile(r"^#?([0-9A-Fa-f]{6}|[0-9A-Fa-f]{3}|[0-9A-Fa-f]{8})$")

_ALLOWED_KEYS = {
    "root": ROOT_KEYS,
    "style": STYLE_KEYS,
    "composition": CD_KEYS,
    "element": ELEMENT_KEYS,
}

_WHAT_TO_WRITE = {
    "high_level_description": "one or two sentences about the whole image (or remove the key)",
    "aesthetics": "a few aesthetic keywords, e.g. 'clean, editorial'",
    "lighting": "the lighting, e.g. 'soft window light from the left'",
    "medium": "the medium, e.g. photograph, illustration, 3d_render, painting, graphic_design",
    "photo": "camera and lens details, e.g. '50mm lens, f/4, eye-level'",
    "art_style": "the art style, e.g. 'flat vector illustration with bold outlines'",
    "background": "the setting behind the elements (ground, sky, walls, weather)",
    "desc": "what the element looks like, starting with what it is",
    "text": "the exact characters to render (or make it an 'obj' element)",
    "type": "'obj' or 'text'",
    "elements": "a list of elements ([] is allowed)",
    "compositional_deconstruction": 'an object {"background": ..., "elements": [...]}',
}


def schema() -> dict:
    """The caption JSON Schema as shipped in the package (a fresh copy)."""
    return json.loads(_schema_text())


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    return resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema  # imported on first use: keeps `import comfyui_ideogram4_int8.ideogram4` cheap

    cls = jsonschema.Draft202012Validator
    data = json.loads(_schema_text())
    cls.check_schema(data)
    return cls(data)


def _block(path: tuple) -> str:
    """Which schema object a path points into: root, style, composition or element."""
    if not path:
        return "root"
    if path == ("style_description",):
        return "style"
    if path == ("compositional_deconstruction",):
        return "composition"
    if len(path) == 3 and path[:2] == ("compositional_deconstruction", "elements"):
        return "element"
    return "value"


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def schema_problems(caption: Any) -> list[Problem]:
    """Every schema violation of a parsed caption, each with its JSON path and a fix."""
    out: list[Problem] = []
    errors = sorted(_validator().iter_errors(caption), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    for err in errors:
        out.extend(_translate(err, caption))
    # One cause can trip several keywords (e.g. a wrong type under if/then); keep each message once.
    seen: set[str] = set()
    unique = []
    for p in out:
        key = str(p)
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def _translate(err, caption) -> list[Problem]:  # one branch per JSON Schema keyword
    path = tuple(err.absolute_path)
    value = err.instance
    kind = err.validator
    last = path[-1] if path else None
    in_bbox = len(path) >= 4 and path[-2] == "bbox" if isinstance(last, int) else last == "bbox"
    in_palette = (len(path) >= 2 and path[-2] == "color_palette") if isinstance(last, int) else last == "color_palette"

    if kind == "type":
        expected = err.validator_value
        if not path:
            return [
                Problem(
                    path,
                    f"the caption must be a JSON object, got {_type_name(value)}",
                    "write a JSON object with at least 'compositional_deconstruction' "
                    "(the repair node can extract one from surrounding text)",
                )
            ]
        if in_bbox and expected == "integer":
            return [
                Problem(
                    path,
                    f"bbox values must be integers, got {_short(value)}",
                    "use whole numbers 0..1000 (normalized per axis, not pixels or fractions)",
                )
            ]
        want = {"string": "a string", "object": "an object", "array": "a list", "integer": "an integer"}.get(
            expected, str(expected)
        )
        hint = _WHAT_TO_WRITE.get(last, "") if isinstance(last, str) else ""
        fix = f"make it {want}" + (f": {hint}" if hint and expected == "string" else "")
        return [Problem(path, f"expected {want}, got {_type_name(value)} {_short(value)}", fix)]

    if kind == "required":
        probs = []
        for key in err.validator_value:
            if isinstance(value, dict) and key not in value:
                hint = _WHAT_TO_WRITE.get(key, "")
                fix = f'add "{key}"' + (f" with {hint}" if hint else "")
                if key in ("aesthetics", "lighting", "medium"):
                    fix += " (a style block is all-or-nothing: aesthetics, lighting, medium and photo or art_style)"
                if key == "text":
                    fix = "add \"text\" with the exact characters to render, or change type to 'obj'"
                probs.append(Problem(path + (key,), "required key is missing", fix))
        return probs

    if kind == "additionalProperties":
        allowed = _ALLOWED_KEYS.get(_block(path), ())
        probs = []
        for key in value:
            if key in allowed:
                continue
            if not path and key == "aspect_ratio":
                fix = (
                    "remove it: the aspect ratio is not a caption key; set width/height on the latent "
                    "(the repair node drops it)"
                )
            elif key.lower() in allowed:
                fix = f"rename it to '{key.lower()}' (keys are lowercase)"
            else:
                fix = f"remove it or move its content into an allowed key ({', '.join(allowed)})"
            probs.append(Problem(path + (key,), "unknown key (not in the Ideogram 4 caption schema)", fix))
        return probs

    if kind == "enum" and last == "type":
        return [
            Problem(
                path,
                f"element type {_short(value)} is not one of {', '.join(ELEMENT_TYPES)}",
                "use 'text' for rendered lettering and 'obj' for everything else",
            )
        ]

    if kind == "pattern":
        if in_palette:
            return [_palette_entry_problem(path, value)]
        hint = _WHAT_TO_WRITE.get(last, "some text") if isinstance(last, str) else "some text"
        if last == "high_level_description":
            return [Problem(path, "is empty", "write one or two sentences about the whole image, or remove the key")]
        return [Problem(path, "is empty", f"write {hint}")]

    if kind == "maxItems":
        if last == "color_palette":
            cap = MAX_STYLE_COLORS if path == ("style_description", "color_palette") else MAX_ELEMENT_COLORS
            where = "the style palette" if cap == MAX_STYLE_COLORS else "an element palette"
            return [
                Problem(
                    path,
                    f"too many colors ({len(value)}); {where} holds at most {cap}",
                    f"remove {len(value) - cap} color(s), keeping the dominant ones",
                )
            ]
        if last == "bbox":
            return [_bbox_len_problem(path, value)]
    if kind == "minItems" and last == "bbox":
        return [_bbox_len_problem(path, value)]

    if kind in ("minimum", "maximum") and in_bbox:
        axis = BBOX_AXES[last] if isinstance(last, int) and last < 4 else "value"
        clamp = BBOX_MIN if kind == "minimum" else BBOX_MAX
        fix = f"use a value in {BBOX_MIN}..{BBOX_MAX} (clamped: {clamp})"
        if kind == "maximum":
            fix += "; coordinates are normalized per axis to 0..1000, not pixels: value * 1000 / image size"
        return [Problem(path, f"{axis} {value} is outside {BBOX_MIN}..{BBOX_MAX}", fix)]

    if kind == "oneOf" and path == ("style_description",) and isinstance(value, dict):
        if "photo" in value and "art_style" in value:
            return [
                Problem(
                    path,
                    "has both 'photo' and 'art_style'; exactly one is allowed",
                    "keep 'photo' for a photograph (medium 'photograph') or 'art_style' for anything else",
                )
            ]
        return [
            Problem(
                path,
                "neither 'photo' nor 'art_style' is present; exactly one is required",
                "add 'photo' (camera details) for a photograph, or 'art_style' for anything else; "
                "or remove the whole style_description",
            )
        ]

    if kind == "not" and len(path) == 3 and isinstance(value, dict) and "text" in value:
        if value.get("type") != "obj":
            return []  # a missing or unknown type is reported on its own
        return [
            Problem(
                path + ("text",),
                "an 'obj' element cannot have a 'text' key",
                "change type to 'text' if these characters should be rendered, otherwise remove 'text'",
            )
        ]

    if kind == "const":
        return []  # only used inside the element if/then; its outcome is reported by required/not
    return [Problem(path, err.message, "see the caption schema (caption.schema.json)")]


def _bbox_len_problem(path, value) -> Problem:
    return Problem(
        path,
        f"bbox has {len(value)} values; it needs exactly 4: [ymin, xmin, ymax, xmax]",
        "give four integers 0..1000, top-left origin, y first; or remove bbox for an unplaced element",
    )


def _palette_entry_problem(path, value) -> Problem:
    if isinstance(value, str):
        m = _LOOSE_HEX.match(value.strip())
        if m:
            digits = m.group(1)
            if len(digits) == 3:
                fixed = "#" + "".join(c * 2 for c in digits).upper()
                return Problem(path, f"{_short(value)} is shorthand hex", f"write it in full as '{fixed}'")
            if len(digits) == 8:
                return Problem(
                    path,
                    f"{_short(value)} has an alpha channel",
                    f"drop the alpha: '#{digits[:6].upper()}' (palettes are opaque)",
                )
            fixed = "#" + digits.upper()
            if value != fixed:
                reason = "lowercase hex" if value.upper() == fixed else "not '#RRGGBB'"
                return Problem(path, f"{_short(value)} is {reason}; colors are uppercase #RRGGBB", f"write '{fixed}'")
    return Problem(
        path,
        f"{_short(value)} is not an uppercase #RRGGBB color",
        "write six hex digits after '#', uppercase, e.g. '#2B1D14' (no names, rgb() or alpha)",
    )
