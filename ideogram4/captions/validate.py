"""``validate_caption`` and ``check_caption``: the official verifier's rules, stricter where input is
clearly a mistake (non-string values, empty strings), each problem with its JSON path and a fix."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .limits import CD_KEYS, ELEMENT_KEYS, MAX_CAPTION_CHARS, MAX_TEXT_TOKENS, ROOT_KEYS, STYLE_KEYS
from .problems import ERROR, WARNING, Problem, format_lines
from .rules import bbox_problems, hint_problems, order_problems, parse_raw, surrogate_problems
from .schema import schema_problems


@dataclass
class Report:
    """Everything found in one caption: ``errors`` make it invalid, ``warnings`` are hints."""

    caption: Any = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def text(
        self,
        notes: list[str] | tuple[str, ...] = (),
        sources: list[str] | tuple[str, ...] = (),
        style_source: str = "",
        own: str = "",
    ) -> str:
        """A human-readable report for a node output.

        ``notes``: changes made on the way (normalized colors, repairs); ``sources``: a label per element
        (e.g. the node it came from), ``style_source`` likewise for ``style_description`` and ``own`` for the
        caption's own fields (high_level_description, background). A label that is a ``builder.Where`` knows the
        widget each key is edited in: such problems are told as "<node>, <widget>: <problem> (<JSON path>)", the
        others as "<JSON path>: <problem> [element from <label>]"."""
        lines = ["VALID Ideogram 4 caption" if self.ok else f"INVALID Ideogram 4 caption: {len(self.errors)} error(s)"]
        if self.errors:
            lines.append("errors:")
            lines += format_lines([_with_source(p, sources, style_source, own) for p in self.errors])
        if self.warnings:
            lines.append(f"warnings ({len(self.warnings)}):")
            lines += format_lines([_with_source(p, sources, style_source, own) for p in self.warnings])
        if notes:
            lines.append(f"changes made ({len(notes)}):")
            lines += format_lines(list(notes))
        return "\n".join(lines)


def _origin(path: tuple, sources, style_source, own) -> tuple[str, tuple]:
    """(label, path below it) of the node a problem at ``path`` belongs to; ("", path) when unknown."""
    if path[:1] == ("style_description",) and style_source:
        return style_source, path[1:]
    if len(path) >= 3 and path[:2] == ("compositional_deconstruction", "elements") and isinstance(path[2], int):
        if path[2] < len(sources) and sources[path[2]]:
            return sources[path[2]], path[3:]
        return "", path
    if own and (path[:1] == ("high_level_description",) or path[:2] == ("compositional_deconstruction", "background")):
        return own, path[-1:]
    return "", path


def _with_source(problem: Problem, sources, style_source: str = "", own: str = "") -> str:
    label, rest = _origin(problem.path, sources, style_source, own)
    place = label.place(rest[0], rest[1] if len(rest) > 1 else None) if rest and hasattr(label, "place") else None
    if place:
        return f"{label}, {place}: {problem.message} — fix: {problem.fix} ({problem.where})"
    if not label:
        return str(problem)
    kind = "style" if problem.path[:1] == ("style_description",) else "element"
    if label == own:
        return str(problem)
    return f"{problem} [{kind} from {label}]"


def check_caption(caption: str | dict, *, hints: bool = True) -> Report:
    """Parse (if text) and check a caption; return all errors and, with ``hints``, soft warnings."""
    problems: list[Problem] = []
    raw_len = None
    if isinstance(caption, (str, bytes, bytearray)):
        if not isinstance(caption, str):
            try:
                caption = bytes(caption).decode("utf-8")
            except UnicodeDecodeError as exc:
                return Report(
                    None,
                    [
                        Problem(
                            (),
                            f"caption bytes are not UTF-8 ({exc.reason} at byte {exc.start})",
                            "save the caption as UTF-8",
                        )
                    ],
                )
        parsed = parse_raw(caption)
        problems.extend(parsed.problems)
        if not parsed.ok:
            return Report(None, problems)
        raw_len = len(caption)
        value = parsed.value
    else:
        value = caption
        try:
            raw_len = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        except (TypeError, ValueError, RecursionError):
            raw_len = None  # non-JSON values are reported by the schema check below
        if raw_len is not None and raw_len > MAX_CAPTION_CHARS:
            problems.append(
                Problem(
                    (),
                    f"the caption is {raw_len} characters as JSON; the model reads at most "
                    f"{MAX_TEXT_TOKENS} tokens (about {MAX_TEXT_TOKENS * 4} characters)",
                    "shorten the descriptions drastically or drop elements",
                )
            )
    problems.extend(schema_problems(value))
    problems.extend(bbox_problems(value))
    problems.extend(order_problems(value))
    problems.extend(surrogate_problems(value))
    if hints:
        problems.extend(hint_problems(value, raw_len))
    # Document order (stable: one path's problems keep their order), so a report reads top to bottom.
    problems.sort(key=lambda p: [_rank(x) for x in p.path])
    return Report(value, problems)


_KEY_RANK: dict[str, int] = {}
for _k in ROOT_KEYS + STYLE_KEYS + CD_KEYS + ELEMENT_KEYS:
    _KEY_RANK.setdefault(_k, len(_KEY_RANK))


def _rank(part) -> tuple:
    """Sort key of one path part: list indexes numerically, known keys in the official order, others last."""
    if isinstance(part, int):
        return (0, part, "")
    return (1, _KEY_RANK.get(part, len(_KEY_RANK)), part)


def validate_caption(caption: str | dict) -> list[str]:
    """Problems that make ``caption`` invalid, each ``"<JSON path>: <what> — fix: <how>"``; empty when valid.

    ``caption`` is raw caption text (also checked for JSON syntax, duplicate keys and the official
    ensure_ascii rule) or an already-parsed dict.
    """
    return [str(p) for p in check_caption(caption, hints=False).errors]
