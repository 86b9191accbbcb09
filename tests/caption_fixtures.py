"""Shared caption fixtures (shipped in the package; the JS tests read the same files)."""

from __future__ import annotations

import json
import pathlib

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "ideogram4" / "captions" / "fixtures"
CAPTION_NODE_IDS = [
    "Ideogram4Int8StyleDescription",
    "Ideogram4Int8TextElement",
    "Ideogram4Int8ObjectElement",
    "Ideogram4Int8LayoutBoxes",
    "Ideogram4Int8CaptionBuilder",
    "Ideogram4Int8CaptionValidate",
]


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def examples() -> list[dict]:
    return load("examples.json")["examples"]


def broken() -> list[dict]:
    return load("broken.json")["cases"]


def drawn_box(x, y, width, height, kind="obj", desc="", text="", palette=()) -> dict:
    """One box as the frontend's bounding-box widget stores it (pixels; ``metadata`` from the pack's editor)."""
    return {
        "x": x,
        "y": y,
        "width": width,
        "height": height,
        "metadata": {"type": kind, "text": text, "desc": desc, "palette": list(palette)},
    }
