"""Ideogram 4 structured captions: schema + rules, validation, the canonical serializer, repair and builders.

ComfyUI-free and cheap to import (``jsonschema`` is imported on first validation).
"""

from .problems import CaptionError, Problem
from .serialize import canonical_order, serialize_caption
from .validate import Report, check_caption, validate_caption

__all__ = [
    "CaptionError",
    "Problem",
    "Report",
    "canonical_order",
    "check_caption",
    "serialize_caption",
    "validate_caption",
]
