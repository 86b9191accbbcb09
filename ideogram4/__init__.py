"""ComfyUI-free model side of Ideogram 4: checkpoint formats, W8A8 linear module, reference DiT,
schedule and presets, caption schema/builder. Never imports ``comfy``."""
