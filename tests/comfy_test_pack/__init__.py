"""Test-only ComfyUI nodes (linked into the test server next to the pack, never shipped).

No text encoder is available in the test environment, so conditioning comes from a safetensors
file the test writes: ``cond`` [B, L, F] and optional ``attention_mask`` [B, L]. A second node
returns a native MODEL that is not Ideogram 4, for the bad-input tests.

Small native Ideogram 4 files: ComfyUI's UNETLoader detects only ``in_channels`` and the block count from a file and
takes every other size (heads, head width, FFN, AdaLN, text-feature width) from
``comfy.supported_models.Ideogram4.unet_extra_config`` — the full 9.3B model's. When the test server is started with
``IDEOGRAM4_TEST_NATIVE_SIZES`` (JSON: those keys), this pack overrides them at import, so the native UNETLoader builds
the tiny synthetic models the tests write. Only the test server ever loads this pack.
"""

import json
import logging
import os

import comfy.model_base
import comfy.model_patcher
import comfy.supported_models
import safetensors.torch
import torch

_SIZES = os.environ.get("IDEOGRAM4_TEST_NATIVE_SIZES")
if _SIZES:
    _override = json.loads(_SIZES)
    _unknown = set(_override) - set(comfy.supported_models.Ideogram4.unet_extra_config)
    if _unknown:
        raise ValueError(f"IDEOGRAM4_TEST_NATIVE_SIZES: unknown keys {sorted(_unknown)}")
    comfy.supported_models.Ideogram4.unet_extra_config = dict(
        comfy.supported_models.Ideogram4.unet_extra_config, **_override
    )
    logging.warning("ideogram4_test_pack: native Ideogram 4 sizes overridden for tests: %s", _override)


class Ideogram4TestConditioning:
    """Stands in for CLIPTextEncode: a stored conditioning. ``text`` (optional) is the caption the real graph
    encodes: not used, it keeps the caption chain in the executed graph, and the node shows it (in the history of
    a prompt that ran the node; ``tag``, also unused, gives each workflow's prompt its own cache entry). Not an
    output node: a prompt whose model part is invalid must not run this part alone."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"path": ("STRING", {"default": "", "tooltip": "safetensors file with 'cond'"})},
            "optional": {"text": ("STRING", {"forceInput": True}), "tag": ("STRING", {"default": ""})},
        }

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, path, text=None, tag=""):
        t = safetensors.torch.load_file(path)
        extra = {"pooled_output": None}
        if "attention_mask" in t:
            extra["attention_mask"] = t["attention_mask"]
        return {"ui": {"text": [text or ""]}, "result": ([[t["cond"], extra]],)}


class Ideogram4TestOtherModel:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "make"
    CATEGORY = "testing"

    def make(self):
        config = comfy.supported_models.SD15({"disable_unet_model_creation": True, "in_channels": 4})
        model = comfy.model_base.BaseModel(config)
        return (comfy.model_patcher.ModelPatcher(model, torch.device("cpu"), torch.device("cpu")),)


NODE_CLASS_MAPPINGS = {
    "Ideogram4TestConditioning": Ideogram4TestConditioning,
    "Ideogram4TestOtherModel": Ideogram4TestOtherModel,
}
