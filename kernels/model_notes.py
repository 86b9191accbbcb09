"""What the panel and the logs say about a model as a whole, apart from the GEMM path each of its linears ran.

A note is one message per (model label, kind): how its attention ran, whether its passes replayed as CUDA graphs,
how its weights streamed or went up to the card, which card it ran on, a forward that routed around the pack's op.
The writers are the pack's runtime in ComfyUI; each sets its own kind and clears it (``None``) when there is nothing
to say. This module holds the one store (``NOTES``) and the functions its writers and readers call: ``set_note``,
``notes``, ``clear``. Which GEMM path each linear ran is the registry's (``registry.REGISTRY``); whoever drops a
model's layers there (a reload, a failed load) drops its notes here too: ``forget`` does both.
"""

from __future__ import annotations

import threading

from .registry import REGISTRY


class ModelNotes:
    """{model label: {kind: message}}, safe to write from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notes: dict[str, dict[str, str]] = {}

    def set(self, model: str, kind: str, message: str | None) -> bool:
        """Set (or, with ``message`` None, clear) the note ``kind`` of ``model``; True when it changed."""
        with self._lock:
            notes = self._notes.setdefault(model, {})
            if notes.get(kind) == message:
                return False
            if message is None:
                notes.pop(kind, None)
            else:
                notes[kind] = message
            return True

    def of(self, model: str | None = None) -> dict[str, dict[str, str]] | dict[str, str]:
        """{kind: message} of ``model``, or {model: {kind: message}} of every model with notes."""
        with self._lock:
            if model is not None:
                return dict(self._notes.get(model, {}))
            return {m: dict(n) for m, n in self._notes.items() if n}

    def clear(self, model: str | None = None) -> None:
        """Drop the notes of ``model``, or of every model."""
        with self._lock:
            if model is None:
                self._notes.clear()
            else:
                self._notes.pop(model, None)


NOTES = ModelNotes()


def set_note(model: str, kind: str, message: str | None) -> bool:
    """Set (or, with ``message`` None, clear) the note ``kind`` of ``model``; True when it changed."""
    return NOTES.set(model, kind, message)


def notes(model: str | None = None) -> dict[str, dict[str, str]] | dict[str, str]:
    """{kind: message} of ``model`` (a copy), or {model: {kind: message}} of every model with notes."""
    return NOTES.of(model)


def clear(model: str | None = None) -> None:
    """Drop the notes of ``model``, or of every model."""
    NOTES.clear(model)


def forget(model: str | None = None) -> None:
    """Drop all the pack says of ``model`` (or of every model): its GEMM records in the registry and its notes."""
    REGISTRY.clear(model)
    NOTES.clear(model)


__all__ = ["NOTES", "ModelNotes", "clear", "forget", "notes", "set_note"]
