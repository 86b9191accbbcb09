"""Repair hand- or LLM-written captions where the intent is clear; refuse (with the problems) otherwise.

Fixed: surrounding prose / code fences, trailing commas, a wrapper object (``{"json_prompt": {...}}``), a
top-level ``aspect_ratio`` (not a caption key), key case/spelling (``"High Level Description"``), element type
case, hex color case / shorthand / ``#`` / opaque alpha, integral or numeric-string bbox values, key order,
``\\u`` escapes of non-ASCII. Refused: anything whose fix needs a guess (unknown keys, swapped or fractional
boxes, too many colors, photo + art_style, duplicate keys, ...). Every change is listed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .colors import normalize_color
from .limits import CD_KEYS, ELEMENT_KEYS, MAX_CAPTION_CHARS, ROOT_KEYS, STYLE_KEYS
from .problems import Problem, json_path
from .rules import escape_problems, parse_raw
from .serialize import canonical_order, dumps_compact
from .validate import Report, check_caption

WRAPPER_KEYS = ("json_prompt", "caption", "prompt", "json")
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)
_TYPE_ALIASES = {"obj": "obj", "object": "obj", "text": "text"}


@dataclass
class RepairResult:
    """``caption``: the repaired caption (None when no JSON object could be read); ``text``: its canonical
    serialization when valid, else None; ``changes``: every change made; ``report``: the check after repair."""

    caption: Any
    text: str | None
    changes: list[str] = field(default_factory=list)
    report: Report = field(default_factory=Report)

    @property
    def ok(self) -> bool:
        return self.text is not None


def _strip_trailing_commas(text: str) -> tuple[str, int]:
    """Remove commas directly before ``}`` / ``]`` outside strings."""
    out, i, n, removed, in_str = [], 0, len(text), 0, False
    while i < n:
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            out.append(c)
        elif c == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j < n and text[j] in "}]":
                removed += 1
            else:
                out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out), removed


def _extract_object(text: str) -> tuple[str, str | None]:
    """The JSON object inside an LLM answer (code fence, or the outermost ``{...}``)."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")) and stripped.endswith(("}", "]")):
        return stripped, None  # already bare JSON: leave it as it is
    fence = _FENCE.search(text)
    if fence and "{" in fence.group(1):
        return fence.group(1).strip(), "took the JSON out of a ``` code fence"
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        return text[start : end + 1], "took the outermost {...} out of the surrounding text"
    return text, None


def _norm_key(key: str) -> str:
    return re.sub(r"[\s\-]+", "_", key.strip()).lower()


def _fix_keys(obj: dict, allowed: tuple[str, ...], path: tuple, changes: list[str]) -> dict:
    """Rename keys whose case/spacing differs from an allowed key (when that key is not also present)."""
    out = {}
    for k, v in obj.items():
        nk = _norm_key(k) if isinstance(k, str) else k
        if k not in allowed and nk in allowed and nk not in obj and nk not in out:
            changes.append(f"{json_path(path + (k,))}: renamed key to '{nk}'")
            out[nk] = v
        else:
            out[k] = v
    return out


def _fix_palette(palette: Any, path: tuple, changes: list[str]) -> Any:
    if not isinstance(palette, list):
        return palette
    out = []
    for j, c in enumerate(palette):
        fixed, note = normalize_color(c)
        if note:
            changes.append(f"{json_path(path + (j,))}: color {note}")
        out.append(fixed)
    return out


def _fix_bbox(bbox: Any, path: tuple, changes: list[str]) -> Any:
    if not isinstance(bbox, list):
        return bbox
    out = []
    for j, v in enumerate(bbox):
        new = v
        if isinstance(v, str) and re.fullmatch(r"\s*-?\d+(\.0+)?\s*", v):
            new = int(float(v))
        elif isinstance(v, float) and math.isfinite(v) and v.is_integer():
            new = int(v)
        if new is not v:
            changes.append(f"{json_path(path + (j,))}: {json.dumps(v)} -> {new}")
        out.append(new)
    return out


def _fix_structure(cap: dict, changes: list[str]) -> dict:
    cap = _fix_keys(cap, ROOT_KEYS, (), changes)
    style = cap.get("style_description")
    if isinstance(style, dict):
        style = _fix_keys(style, STYLE_KEYS, ("style_description",), changes)
        if "color_palette" in style:
            style["color_palette"] = _fix_palette(
                style["color_palette"], ("style_description", "color_palette"), changes
            )
        cap["style_description"] = style
    cd = cap.get("compositional_deconstruction")
    if isinstance(cd, dict):
        cd = _fix_keys(cd, CD_KEYS, ("compositional_deconstruction",), changes)
        elements = cd.get("elements")
        if isinstance(elements, list):
            fixed = []
            for i, el in enumerate(elements):
                path = ("compositional_deconstruction", "elements", i)
                if isinstance(el, dict):
                    el = _fix_keys(el, ELEMENT_KEYS, path, changes)
                    t = el.get("type")
                    if isinstance(t, str) and t not in ("obj", "text") and t.strip().lower() in _TYPE_ALIASES:
                        el["type"] = _TYPE_ALIASES[t.strip().lower()]
                        changes.append(f"{json_path(path + ('type',))}: {t!r} -> {el['type']!r}")
                    if "bbox" in el:
                        el["bbox"] = _fix_bbox(el["bbox"], path + ("bbox",), changes)
                    if "color_palette" in el:
                        el["color_palette"] = _fix_palette(el["color_palette"], path + ("color_palette",), changes)
                fixed.append(el)
            cd["elements"] = fixed
        cap["compositional_deconstruction"] = cd
    return cap


def repair_caption(caption: str | dict) -> RepairResult:
    """Repair ``caption`` (text or dict) where the intent is clear; see the module docstring."""
    changes: list[str] = []
    if isinstance(caption, str):
        text = caption.lstrip("\ufeff")
        if len(text) > MAX_CAPTION_CHARS:
            return RepairResult(None, None, changes, check_caption(text))
        text, note = _extract_object(text)
        if note:
            changes.append(f"$: {note}")
        text, removed = _strip_trailing_commas(text)
        if removed:
            changes.append(f"$: removed {removed} trailing comma(s)")
        if escape_problems(text):
            changes.append("$: non-ASCII characters written as \\u escapes are written literally (ensure_ascii=False)")
        parsed = parse_raw(text)
        if not parsed.ok:
            return RepairResult(None, None, changes, Report(None, parsed.problems))
        dup = [p for p in parsed.problems if "duplicate key" in p.message]
        if dup:
            return RepairResult(parsed.value, None, changes, Report(parsed.value, dup))
        value = parsed.value
    else:
        value = canonical_order(caption)  # a deep copy; the input is never modified
    if isinstance(value, dict):
        keys = [k for k in value if k != "aspect_ratio"]
        if len(keys) == 1 and keys[0] in WRAPPER_KEYS:
            inner = value[keys[0]]
            if isinstance(inner, str):
                try:
                    inner = json.loads(inner)
                except json.JSONDecodeError:
                    inner = None
            if isinstance(inner, dict):
                changes.append(f"$: unwrapped the caption from {{'{keys[0]}': ...}}")
                if "aspect_ratio" in value:
                    changes.append(
                        f"$.aspect_ratio: dropped {value['aspect_ratio']!r} (not a caption key: the aspect "
                        "ratio is the latent's width/height)"
                    )
                value = inner
        if isinstance(value, dict) and "aspect_ratio" in value:
            changes.append(
                f"$.aspect_ratio: dropped {value['aspect_ratio']!r} (not a caption key: the aspect ratio "
                "is the latent's width/height)"
            )
            value = {k: v for k, v in value.items() if k != "aspect_ratio"}
        value = _fix_structure(value, changes)
    ordered = canonical_order(value)
    if isinstance(value, dict) and list(_key_orders(ordered)) != list(_key_orders(value)):
        changes.append("$: put keys in the official order")
    report = check_caption(ordered)
    text_out = dumps_compact(ordered) if report.ok else None
    return RepairResult(ordered, text_out, changes, report)


def _key_orders(value: Any, path: tuple = ()):
    """Every object's key sequence, for detecting a reorder."""
    if isinstance(value, dict):
        yield path, tuple(value)
        for k, v in value.items():
            yield from _key_orders(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _key_orders(v, path + (i,))


__all__ = ["RepairResult", "repair_caption", "Problem"]
