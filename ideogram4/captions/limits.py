"""Every limit and fixed vocabulary of the Ideogram 4 caption format, in one place.

Facts from the official ``CaptionVerifier`` (``ideogram-oss/ideogram4``) and the pipeline's token
limit; the JS editor mirrors these (``web/lib/caption_limits.mjs``) and a test checks both
against ``fixtures/limits.json``.
"""

from __future__ import annotations

# bbox: [ymin, xmin, ymax, xmax], integers normalized per axis to 0..1000, origin top-left.
BBOX_LEN = 4
BBOX_MIN = 0
BBOX_MAX = 1000
BBOX_AXES = ("ymin", "xmin", "ymax", "xmax")

# color_palette caps: the style block's and each element's.
MAX_STYLE_COLORS = 16
MAX_ELEMENT_COLORS = 5
HEX_COLOR_PATTERN = r"^#[0-9A-F]{6}$"

ELEMENT_TYPES = ("obj", "text")

# Official key orders (exact sequences over the keys present).
ROOT_KEYS = ("high_level_description", "style_description", "compositional_deconstruction")
STYLE_KEYS_PHOTO = ("aesthetics", "lighting", "photo", "medium", "color_palette")
STYLE_KEYS_ART = ("aesthetics", "lighting", "medium", "art_style", "color_palette")
STYLE_KEYS = ("aesthetics", "lighting", "photo", "medium", "art_style", "color_palette")
CD_KEYS = ("background", "elements")
OBJ_KEYS = ("type", "bbox", "desc", "color_palette")
TEXT_KEYS = ("type", "bbox", "text", "desc", "color_palette")
ELEMENT_KEYS = ("type", "bbox", "text", "desc", "color_palette")

# The pipeline refuses prompts longer than this many Qwen3-VL tokens (after the chat template).
MAX_TEXT_TOKENS = 2048
# Rough estimate used for a soft warning only (no tokenizer here): ~4 characters per token.
CHARS_PER_TOKEN_ESTIMATE = 4

# Guidance from the official system prompt (soft hints, never errors).
HLD_WORD_HINT = 50
DESC_WORD_HINT = 60
ELEMENT_COUNT_HINT = 40

# Hard guards against pathological input (far beyond anything the model can read).
MAX_CAPTION_CHARS = 200_000
MAX_NESTING_DEPTH = 64
# At most this many problems are listed; the rest are counted, never hidden silently.
MAX_REPORTED_PROBLEMS = 50


def as_dict() -> dict:
    """The limits the JS side mirrors, as plain JSON-able data (see fixtures/limits.json)."""
    return {
        "BBOX_LEN": BBOX_LEN,
        "BBOX_MIN": BBOX_MIN,
        "BBOX_MAX": BBOX_MAX,
        "BBOX_AXES": list(BBOX_AXES),
        "MAX_STYLE_COLORS": MAX_STYLE_COLORS,
        "MAX_ELEMENT_COLORS": MAX_ELEMENT_COLORS,
        "HEX_COLOR_PATTERN": HEX_COLOR_PATTERN,
        "ELEMENT_TYPES": list(ELEMENT_TYPES),
        "OBJ_KEYS": list(OBJ_KEYS),
        "TEXT_KEYS": list(TEXT_KEYS),
        "MAX_TEXT_TOKENS": MAX_TEXT_TOKENS,
        "CHARS_PER_TOKEN_ESTIMATE": CHARS_PER_TOKEN_ESTIMATE,
    }
