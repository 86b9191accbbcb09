"""Caption rules JSON Schema cannot express: key order, bbox ordering and integer tokens,
unpaired surrogates, and the raw-text rules (JSON syntax, duplicate keys, the escape rule, size)."""

from __future__ import annotations

import json
import re
from typing import Any

from .limits import (
    BBOX_LEN,
    CD_KEYS,
    MAX_CAPTION_CHARS,
    MAX_NESTING_DEPTH,
    MAX_TEXT_TOKENS,
    OBJ_KEYS,
    ROOT_KEYS,
    STYLE_KEYS_ART,
    STYLE_KEYS_PHOTO,
    TEXT_KEYS,
)
from .problems import WARNING, Problem

# A JSON string escape, scanned left to right so that an escaped backslash is consumed as a pair.
_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|.)", re.S)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _order_problem(path: tuple, present: list[str], expected: tuple[str, ...]) -> Problem | None:
    known = [k for k in present if k in expected]
    want = [k for k in expected if k in known]
    if known == want:
        return None
    return Problem(
        path,
        f"keys are in the order ({', '.join(known)}); expected ({', '.join(want)})",
        "reorder the keys (the official order is part of the format; serialize_caption and the repair node write it)",
    )


def order_problems(caption: Any) -> list[Problem]:
    """Key-order problems of every block whose kind is known (photo vs art style, obj vs text)."""
    if not isinstance(caption, dict):
        return []
    out = []
    p = _order_problem((), list(caption), ROOT_KEYS)
    if p:
        out.append(p)
    style = caption.get("style_description")
    if isinstance(style, dict) and (("photo" in style) != ("art_style" in style)):
        expected = STYLE_KEYS_PHOTO if "photo" in style else STYLE_KEYS_ART
        p = _order_problem(("style_description",), list(style), expected)
        if p:
            out.append(p)
    cd = caption.get("compositional_deconstruction")
    if isinstance(cd, dict):
        p = _order_problem(("compositional_deconstruction",), list(cd), CD_KEYS)
        if p:
            out.append(p)
        elements = cd.get("elements")
        if isinstance(elements, list):
            for i, el in enumerate(elements):
                if isinstance(el, dict) and el.get("type") in ("obj", "text"):
                    expected = TEXT_KEYS if el["type"] == "text" else OBJ_KEYS
                    p = _order_problem(("compositional_deconstruction", "elements", i), list(el), expected)
                    if p:
                        out.append(p)
    return out


def bbox_problems(caption: Any) -> list[Problem]:
    """Integral floats (the schema's "integer" accepts 1000.0, the verifier does not) and min > max."""
    out: list[Problem] = []
    cd = caption.get("compositional_deconstruction") if isinstance(caption, dict) else None
    elements = cd.get("elements") if isinstance(cd, dict) else None
    if not isinstance(elements, list):
        return out
    for i, el in enumerate(elements):
        bbox = el.get("bbox") if isinstance(el, dict) else None
        if not isinstance(bbox, list) or len(bbox) != BBOX_LEN:
            continue
        path = ("compositional_deconstruction", "elements", i, "bbox")
        for j, v in enumerate(bbox):
            if isinstance(v, float) and v.is_integer():
                out.append(
                    Problem(
                        path + (j,),
                        f"bbox values must be integer JSON numbers, got {v!r}",
                        f"write {int(v)} (no decimal point)",
                    )
                )
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox):
            continue
        ymin, xmin, ymax, xmax = bbox
        swapped = list(bbox)
        bad = []
        if ymin > ymax:
            bad.append(f"ymin ({_num(ymin)}) > ymax ({_num(ymax)})")
            swapped[0], swapped[2] = ymax, ymin
        if xmin > xmax:
            bad.append(f"xmin ({_num(xmin)}) > xmax ({_num(xmax)})")
            swapped[1], swapped[3] = xmax, xmin
        if bad:
            out.append(
                Problem(
                    path,
                    "; ".join(bad) + " (bbox is [ymin, xmin, ymax, xmax])",
                    f"swap them: {json.dumps([_num(v) for v in swapped])}; if the box was written "
                    "as [xmin, ymin, xmax, ymax], reorder it to y first",
                )
            )
    return out


def _num(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v


def surrogate_problems(caption: Any, path: tuple = ()) -> list[Problem]:
    """Strings with unpaired surrogates cannot be written as UTF-8 (they come from broken escapes)."""
    out: list[Problem] = []
    stack = [(path, caption)]
    while stack:
        p, v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                out.append(
                    Problem(
                        p,
                        "contains an unpaired UTF-16 surrogate (a broken \\uD8xx escape)",
                        "retype the character (e.g. the emoji) or remove it",
                    )
                )
        elif isinstance(v, dict):
            stack.extend((p + (k,), x) for k, x in v.items())
            stack.extend(((p + (k,)), k) for k in v if isinstance(k, str) and _SURROGATE.search(k))
        elif isinstance(v, list):
            stack.extend((p + (i,), x) for i, x in enumerate(v))
    return sorted(out, key=lambda q: [str(x) for x in q.path])


def hint_problems(caption: Any, raw_len: int | None = None) -> list[Problem]:
    """Soft warnings from the official guidance; they never make a caption invalid."""
    from .limits import CHARS_PER_TOKEN_ESTIMATE, DESC_WORD_HINT, ELEMENT_COUNT_HINT, HLD_WORD_HINT

    out: list[Problem] = []
    if not isinstance(caption, dict):
        return out
    W = WARNING
    hld = caption.get("high_level_description")
    if "high_level_description" not in caption:
        out.append(
            Problem(
                ("high_level_description",),
                "missing (optional, but strongly recommended)",
                "add one or two sentences about the whole image, starting with the subject",
                W,
            )
        )
    elif isinstance(hld, str) and len(hld.split()) > HLD_WORD_HINT:
        out.append(
            Problem(
                ("high_level_description",),
                f"{len(hld.split())} words; the guidance is at most {HLD_WORD_HINT}",
                "shorten it; details belong in the elements",
                W,
            )
        )
    style = caption.get("style_description")
    if isinstance(style, dict) and "photo" in style and style.get("medium") not in (None, "photograph"):
        out.append(
            Problem(
                ("style_description", "medium"),
                f"is {style.get('medium')!r} with a 'photo' block",
                "use medium 'photograph' with 'photo', or switch to 'art_style'",
                W,
            )
        )
    if isinstance(style, dict) and isinstance(style.get("color_palette"), list):
        out.extend(_dup_palette(("style_description", "color_palette"), style["color_palette"]))
    cd = caption.get("compositional_deconstruction")
    elements = cd.get("elements") if isinstance(cd, dict) else None
    if isinstance(elements, list):
        if len(elements) > ELEMENT_COUNT_HINT:
            out.append(
                Problem(
                    ("compositional_deconstruction", "elements"),
                    f"{len(elements)} elements",
                    f"keep to the main subjects (over {ELEMENT_COUNT_HINT} is far outside the "
                    "training captions); put crowds and scenery in background",
                    W,
                )
            )
        for i, el in enumerate(elements):
            if not isinstance(el, dict):
                continue
            path = ("compositional_deconstruction", "elements", i)
            desc = el.get("desc")
            if isinstance(desc, str) and len(desc.split()) > DESC_WORD_HINT:
                out.append(
                    Problem(
                        path + ("desc",),
                        f"{len(desc.split())} words; the guidance is at most {DESC_WORD_HINT}",
                        "shorten it",
                        W,
                    )
                )
            text = el.get("text")
            if isinstance(text, str) and "\\n" in text:
                out.append(
                    Problem(
                        path + ("text",),
                        "contains a literal backslash-n ('\\\\n')",
                        "for a line break, use a real newline (Enter in the text box)",
                        W,
                    )
                )
            if isinstance(el.get("color_palette"), list):
                out.extend(_dup_palette(path + ("color_palette",), el["color_palette"]))
    if raw_len is not None and raw_len / CHARS_PER_TOKEN_ESTIMATE > MAX_TEXT_TOKENS * 0.9:
        est = raw_len // CHARS_PER_TOKEN_ESTIMATE
        out.append(
            Problem(
                (),
                f"about {est} tokens (estimated from {raw_len} characters); the pipeline refuses "
                f"more than {MAX_TEXT_TOKENS}",
                "shorten descriptions or drop minor elements",
                W,
            )
        )
    return out


def _dup_palette(path, palette) -> list[Problem]:
    seen, out = set(), []
    for j, c in enumerate(palette):
        if isinstance(c, str) and c.upper() in seen:
            out.append(Problem(path + (j,), f"{c} repeats an earlier color", "remove the duplicate", WARNING))
        if isinstance(c, str):
            seen.add(c.upper())
    return out


# ---- raw text -------------------------------------------------------------------------------------------------


class RawParse:
    """Result of parsing raw caption text: the value (or None) and the raw-text problems."""

    def __init__(self, value: Any, problems: list[Problem], ok: bool):
        self.value, self.problems, self.ok = value, problems, ok


def parse_raw(text: str) -> RawParse:
    """Parse caption text; report size, syntax, nesting, duplicate keys and the escape rule."""
    if not isinstance(text, str):
        return RawParse(
            None,
            [
                Problem(
                    (),
                    f"expected caption text or a dict, got {type(text).__name__}",
                    "pass the caption as a JSON string or a dict",
                )
            ],
            False,
        )
    if len(text) > MAX_CAPTION_CHARS:
        return RawParse(
            None,
            [
                Problem(
                    (),
                    f"caption text is {len(text)} characters; refusing to parse more than "
                    f"{MAX_CAPTION_CHARS} (the model reads at most {MAX_TEXT_TOKENS} tokens)",
                    "shorten it drastically; a good caption is a few thousand characters",
                )
            ],
            False,
        )
    problems: list[Problem] = []

    def hook(pairs):
        obj = _Obj()
        for k, v in pairs:
            if k in obj:
                obj.dups.append(k)
            obj[k] = v
        return obj

    try:
        value = json.loads(text, object_pairs_hook=hook)
    except json.JSONDecodeError as exc:
        fix = "write valid JSON"
        if not text.strip().startswith(("{", "[")):
            fix = (
                "a caption is a JSON object, not plain text; build one with the caption builder node, or let the "
                "repair node extract the JSON from an LLM answer"
            )
        elif re.search(r",\s*[}\]]", text):
            fix = "remove the trailing comma(s) (the repair node does this)"
        return RawParse(
            None, [Problem((), f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", fix)], False
        )
    except RecursionError:
        too_deep = Problem((), "JSON is nested too deeply to parse", "flatten it; a caption is 4 levels deep")
        return RawParse(None, [too_deep], False)
    if _depth(value) > MAX_NESTING_DEPTH:
        return RawParse(
            None,
            [
                Problem(
                    (),
                    f"JSON is nested deeper than {MAX_NESTING_DEPTH} levels",
                    "a caption is 4 levels deep; remove the extra nesting",
                )
            ],
            False,
        )
    value, dups = _plain(value)
    for path, key in dups:
        problems.append(
            Problem(
                path + (key,),
                "duplicate key (JSON keeps only the last value)",
                f"keep one {key!r} entry in this object",
            )
        )
    problems.extend(escape_problems(text))
    return RawParse(value, problems, True)


def escape_problems(text: str) -> list[Problem]:
    """The official ensure_ascii rule: \\u escapes of non-ASCII and no literal non-ASCII character."""
    count, example = 0, None
    for m in _ESCAPE.finditer(text):
        if m.group(1) and int(m.group(1), 16) >= 0x80:
            count += 1
            example = example or m.group(0)
    if count and text.isascii():
        return [
            Problem(
                (),
                f"raw text has {count} \\u escape(s) of non-ASCII characters (e.g. {example}) and no "
                "literal non-ASCII character: it was written with ensure_ascii=True",
                "write non-ASCII characters literally: json.dumps(..., ensure_ascii=False) or "
                "serialize_caption(); the repair node rewrites it",
            )
        ]
    return []


class _Obj(dict):
    """A parsed JSON object that remembers keys it saw twice."""

    def __init__(self):
        super().__init__()
        self.dups: list[str] = []


def _plain(value: Any, path: tuple = ()) -> tuple[Any, list[tuple[tuple, str]]]:
    """Turn parsed ``_Obj`` trees back into plain dicts and collect duplicate keys with their paths."""
    dups: list[tuple[tuple, str]] = []
    if isinstance(value, dict):
        dups.extend((path, k) for k in getattr(value, "dups", ()))
        out = {}
        for k, v in value.items():
            out[k], sub = _plain(v, path + (k,))
            dups.extend(sub)
        return out, dups
    if isinstance(value, list):
        items = []
        for i, v in enumerate(value):
            item, sub = _plain(v, path + (i,))
            items.append(item)
            dups.extend(sub)
        return items, dups
    return value, dups


def _depth(value: Any) -> int:
    depth, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            depth = max(depth, d)
            if d > MAX_NESTING_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return depth
