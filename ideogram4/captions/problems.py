"""A caption problem: where (JSON path), what, and how to fix it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import public_error
from .limits import MAX_REPORTED_PROBLEMS

ERROR = "error"
WARNING = "warning"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def json_path(parts: Iterable[str | int]) -> str:
    """Path parts to text: ``("compositional_deconstruction", "elements", 2, "bbox", 1)`` ->
    ``$.compositional_deconstruction.elements[2].bbox[1]``."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}"
        else:
            out += "[" + repr(part) + "]"
    return out


@dataclass(frozen=True)
class Problem:
    """One finding. ``severity`` is ``"error"`` (the caption is invalid) or ``"warning"`` (a hint)."""

    path: tuple[str | int, ...]
    message: str
    fix: str
    severity: str = ERROR

    @property
    def where(self) -> str:
        return json_path(self.path)

    def __str__(self) -> str:
        return f"{self.where}: {self.message} — fix: {self.fix}"


@public_error
class CaptionError(ValueError):
    """Raised where a caption must be valid (serializer, strict nodes); lists every problem."""

    def __init__(self, problems: list[Problem] | list[str], intro: str = "invalid Ideogram 4 caption"):
        self.problems = [str(p) for p in problems]
        super().__init__(intro + ":\n" + "\n".join(format_lines(self.problems)))


def format_lines(lines: list[str], limit: int = MAX_REPORTED_PROBLEMS) -> list[str]:
    """At most ``limit`` lines plus a count of the rest, so a huge report stays readable but complete in number."""
    shown = [f"- {line}" for line in lines[:limit]]
    if len(lines) > limit:
        shown.append(f"- ... and {len(lines) - limit} more problem(s) of the same kinds; fix the ones above first")
    return shown
