"""ComfyUI-free model side of Ideogram 4: checkpoint formats, W8A8 linear module, reference DiT,
schedule and presets, caption schema/builder. Never imports ``comfy``."""

import importlib

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


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = sorted(_LAZY)
