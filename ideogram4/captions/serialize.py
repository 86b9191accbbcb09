"""The one canonical caption serializer: official key order, compact separators, ``ensure_ascii=False``."""

from __future__ import annotations

import json
from typing import Any

from .limits import CD_KEYS, OBJ_KEYS, ROOT_KEYS, STYLE_KEYS_ART, STYLE_KEYS_PHOTO, TEXT_KEYS
from .problems import CaptionError, Problem


def _ordered(obj: dict, order: tuple[str, ...]) -> dict:
    """Known keys in ``order``, then any unknown keys in their original order (so validation still sees them)."""
    out = {k: obj[k] for k in order if k in obj}
    out.update((k, v) for k, v in obj.items() if k not in out)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def canonical_order(caption: Any) -> Any:
    """A copy of ``caption`` with every block's keys in the official order (tuples become lists).

    Which order applies to a style block (photo vs art style) and an element (obj vs text) is read from the
    block itself; blocks of unknown kind keep their order.
    """
    caption = _plain(caption)
    if not isinstance(caption, dict):
        return caption
    caption = _ordered(caption, ROOT_KEYS)
    style = caption.get("style_description")
    if isinstance(style, dict):
        order = STYLE_KEYS_PHOTO if "photo" in style and "art_style" not in style else STYLE_KEYS_ART
        caption["style_description"] = _ordered(style, order)
    cd = caption.get("compositional_deconstruction")
    if isinstance(cd, dict):
        cd = _ordered(cd, CD_KEYS)
        elements = cd.get("elements")
        if isinstance(elements, list):
            cd["elements"] = [
                _ordered(el, TEXT_KEYS if el.get("type") == "text" else OBJ_KEYS) if isinstance(el, dict) else el
                for el in elements
            ]
        caption["compositional_deconstruction"] = cd
    return caption


def dumps_compact(value: Any) -> str:
    """``json.dumps`` as the official tooling writes captions (no reordering, no checks)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def serialize_caption(caption: dict) -> str:
    """Serialize a caption canonically; raise :class:`CaptionError` listing every problem if it is invalid.

    Keys are put in the official order, so a caption that is valid except for key order serializes fine;
    anything else (unknown keys, bad values) is refused rather than dropped. Same input, same bytes.
    """
    from .validate import check_caption

    if not isinstance(caption, dict):
        raise CaptionError(
            [
                Problem(
                    (),
                    f"expected a caption dict, got {type(caption).__name__}",
                    "parse caption text with json.loads first, or use the repair node",
                )
            ]
        )
    ordered = canonical_order(caption)
    report = check_caption(ordered, hints=False)
    if not report.ok:
        raise CaptionError(report.errors, "cannot serialize an invalid Ideogram 4 caption")
    return dumps_compact(ordered)
