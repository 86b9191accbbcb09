// Limits of the Ideogram 4 caption format, mirrored from ideogram4/captions/limits.py.
// Tested against ideogram4/captions/fixtures/limits.json (tests/js/limits.test.mjs), as is the Python side.
export const BBOX_LEN = 4;
export const BBOX_MIN = 0;
export const BBOX_MAX = 1000;
export const BBOX_AXES = ["ymin", "xmin", "ymax", "xmax"];
export const MAX_STYLE_COLORS = 16;
export const MAX_ELEMENT_COLORS = 5;
export const HEX_COLOR_PATTERN = "^#[0-9A-F]{6}$";
export const ELEMENT_TYPES = ["obj", "text"];
export const OBJ_KEYS = ["type", "bbox", "desc", "color_palette"];
export const TEXT_KEYS = ["type", "bbox", "text", "desc", "color_palette"];
export const MAX_TEXT_TOKENS = 2048;
export const CHARS_PER_TOKEN_ESTIMATE = 4;

// Key orders of the other blocks (used by the serializer mirror; checked through the serialization fixture).
export const ROOT_KEYS = ["high_level_description", "style_description", "compositional_deconstruction"];
export const STYLE_KEYS_PHOTO = ["aesthetics", "lighting", "photo", "medium", "color_palette"];
export const STYLE_KEYS_ART = ["aesthetics", "lighting", "medium", "art_style", "color_palette"];
export const CD_KEYS = ["background", "elements"];

export const LIMITS = {
  BBOX_LEN, BBOX_MIN, BBOX_MAX, BBOX_AXES, MAX_STYLE_COLORS, MAX_ELEMENT_COLORS, HEX_COLOR_PATTERN,
  ELEMENT_TYPES, OBJ_KEYS, TEXT_KEYS, MAX_TEXT_TOKENS, CHARS_PER_TOKEN_ESTIMATE,
};
