"""Ideogram 4 structured captions: schema + rules, validation, the canonical serializer, repair and builders.

Modules: ``limits`` (every limit and key order), ``caption.schema.json`` + ``schema`` (JSON Schema 2020-12 and
its error messages), ``rules`` (what a schema cannot express, raw-text checks, hints), ``validate``,
``serialize``, ``repair`` (LLM/hand-written captions), ``colors``, ``builder`` (node inputs -> caption),
``fixtures/`` (examples and broken variants shared with the JS tests).
ComfyUI-free and cheap to import (``jsonschema`` is imported on first validation).
"""

from .problems import CaptionError, Problem
from .repair import RepairResult, repair_caption
from .serialize import canonical_order, serialize_caption
from .validate import Report, check_caption, validate_caption

__all__ = [
    "CaptionError",
    "Problem",
    "RepairResult",
    "Report",
    "canonical_order",
    "check_caption",
    "repair_caption",
    "serialize_caption",
    "validate_caption",
]
