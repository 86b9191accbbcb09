"""Palette normalization shared by the builders and the repair path: fix casing/shorthand where the
intent is clear, keep anything else unchanged so validation reports it."""

from __future__ import annotations

import re

_HEX6 = re.compile(r"^#?([0-9A-Fa-f]{6})$")
_HEX3 = re.compile(r"^#?([0-9A-Fa-f]{3})$")
_HEX8_OPAQUE = re.compile(r"^#?([0-9A-Fa-f]{6})[Ff]{2}$")
_SPLIT = re.compile(r"[\s,;]+")


def normalize_color(value):
    """Return ``(color, note)``: ``'#c8a27a'`` -> ``'#C8A27A'``, ``'#FFF'`` -> ``'#FFFFFF'``, ``'2B1D14'`` ->
    ``'#2B1D14'``, opaque ``'#2b1d14ff'`` -> ``'#2B1D14'``. Anything else is returned unchanged with no note."""
    if not isinstance(value, str):
        return value, None
    s = value.strip()
    for pattern, expand in ((_HEX6, lambda d: d), (_HEX3, lambda d: "".join(c * 2 for c in d)), (_HEX8_OPAQUE, None)):
        m = pattern.match(s)
        if m:
            digits = m.group(1) if expand is None else expand(m.group(1))
            fixed = "#" + digits.upper()
            return fixed, (None if fixed == value else f"{value!r} -> {fixed!r}")
    return value, None


def parse_palette(value) -> tuple[list, list[str]]:
    """A palette from node input: a list, or text such as ``"#2B1D14, #c8a27a #FFF"``.

    Returns the entries (normalized where the intent is clear, otherwise unchanged) and notes on what changed.
    Nothing is dropped: the cap (16 / 5) and invalid entries are left for validation to report.
    """
    if value is None:
        return [], []
    items = [x for x in _SPLIT.split(value) if x] if isinstance(value, str) else list(value)
    out, notes = [], []
    for item in items:
        fixed, note = normalize_color(item)
        out.append(fixed)
        if note:
            notes.append(note)
    return out, notes
