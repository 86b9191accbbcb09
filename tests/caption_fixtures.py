"""Shared caption fixtures (shipped in the package; the JS tests read the same files)."""

from __future__ import annotations

import json
import pathlib

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "ideogram4" / "captions" / "fixtures"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def examples() -> list[dict]:
    return load("examples.json")["examples"]


def broken() -> list[dict]:
    return load("broken.json")["cases"]
