"""ComfyUI-free model side of Ideogram 4: checkpoint formats, W8A8 linear module, reference DiT,
schedule and presets, caption schema/builder. Never imports ``comfy``."""

from .lazy import lazy_getattr

# Public names, imported on first use so `import ...ideogram4` stays cheap (no torch until needed).
_LAZY = {
    # model side (issue 4): readers, DiT, schedule, sampler
    "read_branch": ".checkpoint",
    "BranchStateDict": ".checkpoint",
    "CheckpointError": ".errors",
    "Ideogram4Config": ".config",
    "Ideogram4DiT": ".dit",
    "sample": ".sampler",
    "make_noise": ".sampler",
    "sigmas": ".schedule",
    "PRESETS": ".schedule",
    "Preset": ".schedule",
    "W8A8Linear": ".w8a8_module",
    "w8a8_linears": ".w8a8_module",
    "float_linears": ".w8a8_module",
    "dequant_linears": ".w8a8_module",
    # captions (issue 6): jsonschema loads on first validation
    "validate_caption": ".captions",
    "serialize_caption": ".captions",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


__all__ = sorted(_LAZY)
