"""ComfyUI-free model side of Ideogram 4: checkpoint formats, W8A8 linear module, reference DiT,
schedule and presets, caption schema/builder. Never imports ``comfy``."""

# Caption API (light: jsonschema loads on first validation).
from .captions import serialize_caption as serialize_caption
from .captions import validate_caption as validate_caption
