"""The text encoder a user runs before every prompt, for the benchmarks' prompt cycle (encode, then sample).

ComfyUI's Ideogram 4 text encoder is Qwen3-VL 8B (``qwen3vl_8b_fp8_scaled.safetensors``, CLIPLoader type
``ideogram4``). It cannot be downloaded here, so ``write`` makes a file of the same layout with seeded random
weights: every tensor of ComfyUI's own encoder module (built on the meta device, so the keys and shapes are the ones
ComfyUI loads), under the file's key prefixes (``model.language_model.``, ``model.visual.``, ``lm_head.``), the
language model's linears stored e4m3 with a per-tensor scale and a ``comfy_quant`` marker as the fp8_scaled file
stores them, everything else bf16. Loaded through ``comfy.sd.load_clip`` and encoded as CLIPTextEncode encodes, it
takes the card's memory and moves under ComfyUI's model management as the real one does; its features are noise.

Needs ComfyUI importable (``comfy`` on ``sys.path``).
"""

from __future__ import annotations

import pathlib

import torch

from ..ideogram4.formats.comfy_quant import encode_comfy_quant
from ..ideogram4.safetensors_io import write_safetensors

FILE_NAME = "qwen3vl_8b_fp8_scaled.safetensors"
E4M3_MAX = 448.0
QUANTIZED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj")
QUANTIZED += ("mlp.up_proj", "mlp.down_proj")
PROMPTS = (  # one per image of a run: a user changing the prompt, short and long
    "a red fox in fresh snow, morning light",
    '{"style": "poster", "text": "OPEN LATE", "elements": [{"kind": "neon sign", "color": "#ff3366"}], '
    '"background": "a rainy street at night, reflections on wet asphalt, a tram passing"}',
    "an isometric city block made of paper, soft shadows, pastel colours",
    "a hand-lettered menu board for a small bakery: croissant, pain au chocolat, baguette, prices in chalk",
)
_PREFIXES = (("model.", "model.language_model."), ("visual.", "model.visual."))


def _encoder_module():
    """ComfyUI's Ideogram 4 Qwen3-VL 8B encoder module, on the meta device (no memory)."""
    import comfy.text_encoders.ideogram4 as ideogram4_te

    with torch.device("meta"):
        return ideogram4_te.Ideogram4Qwen3VLTEModel(device="meta", dtype=torch.bfloat16)


def file_key(module_key: str) -> str | None:
    """The key a module state key has in the downloaded file, or None for one the file does not carry."""
    inner = module_key.split(".transformer.", 1)[-1] if ".transformer." in module_key else None
    if inner is None:
        return None  # logit_scale and the like: the loader's own
    if inner.startswith("model.lm_head."):
        return inner[len("model.") :]
    for ours, theirs in _PREFIXES:
        if inner.startswith(ours):
            return theirs + inner[len(ours) :]
    return inner


def is_quantized(key: str) -> bool:
    """A language-model linear's weight (stored e4m3 in the fp8_scaled file)."""
    return (
        key.startswith("model.language_model.layers.")
        and key.endswith(".weight")
        and any(f".{q}." in key for q in QUANTIZED)
    )


def specs() -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Every key of the file with its dtype and shape."""
    marker = encode_comfy_quant({"format": "float8_e4m3fn"})
    out: dict = {}
    for key, t in _encoder_module().state_dict().items():
        name = file_key(key)
        if name is None:
            continue
        if is_quantized(name):
            module = name[: -len(".weight")]
            out[name] = (torch.float8_e4m3fn, tuple(t.shape))
            out[module + ".weight_scale"] = (torch.float32, ())
            out[module + ".comfy_quant"] = (torch.uint8, (len(marker),))
        else:
            out[name] = (torch.bfloat16, tuple(t.shape))
    return out


def write(folder: str | pathlib.Path, seed: int = 0, device: str | None = None) -> pathlib.Path:
    """The synthetic encoder file in ``folder`` (``FILE_NAME``), seeded: linears and embeddings N(0, 0.02), norms 1,
    biases 0. Random numbers are drawn on ``device`` (the GPU when there is one)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    table = specs()
    marker = encode_comfy_quant({"format": "float8_e4m3fn"})
    gen = torch.Generator(device=device).manual_seed(seed)
    scales: dict[str, torch.Tensor] = {}

    def produce(key: str) -> torch.Tensor:
        dtype, shape = table[key]
        module, _, leaf = key.rpartition(".")
        if leaf == "comfy_quant":
            return marker
        if leaf == "weight_scale":
            return scales.pop(module)
        if dtype == torch.float8_e4m3fn:
            w = torch.randn(shape, generator=gen, device=device) * 0.02
            scale = (w.abs().amax() / E4M3_MAX).clamp_min(1e-12)
            scales[module] = scale.reshape(()).float().cpu()  # sorted order: the scale comes after its weight
            return (w / scale).to(dtype)
        if leaf == "bias":
            return torch.zeros(shape, dtype=dtype)
        if "norm" in module.rsplit(".", 1)[-1]:
            return torch.ones(shape, dtype=dtype)
        return (torch.randn(shape, generator=gen, device=device) * 0.02).to(dtype)

    path = pathlib.Path(folder) / FILE_NAME
    return write_safetensors(path, table, produce, {"format": "comfy-fp8-synthetic"})


def load(path: str | pathlib.Path):
    """The CLIP object, through ComfyUI's own loader as CLIPLoader (type ideogram4) loads it."""
    import comfy.sd

    return comfy.sd.load_clip(ckpt_paths=[str(path)], clip_type=comfy.sd.CLIPType.IDEOGRAM4)


def encode(clip, text: str):
    """CONDITIONING of ``text``, as CLIPTextEncode makes it."""
    return clip.encode_from_tokens_scheduled(clip.tokenize(text))


def memory_state(clip) -> dict:
    """Where the text encoder's weights are (a dynamic-VRAM model: pages on the card, pinned host copies) and what
    the host has left: whether ComfyUI still lists it as loaded, its card and pinned GiB, ComfyUI's pinned total and
    the RAM available (ComfyUI's pin budget evicts pins when that runs short)."""
    import comfy.model_management as mm
    import psutil

    patcher = clip.patcher
    listed = any(m.model is patcher for m in mm.current_loaded_models)
    dynamic = patcher.is_dynamic()
    return {
        "listed": listed,
        "card_gib": round(patcher.loaded_size() / 2**30, 2),
        "pinned_gib": round(patcher.pinned_memory_size() / 2**30, 2) if dynamic else None,
        "comfy_pinned_gib": round(mm.TOTAL_PINNED_MEMORY / 2**30, 2),
        "ram_available_gib": round(psutil.virtual_memory().available / 2**30, 1),
    }


__all__ = ["write", "load", "encode", "memory_state", "specs", "file_key", "is_quantized", "PROMPTS", "FILE_NAME"]
