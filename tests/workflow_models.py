"""Small synthetic stand-ins for the model files the example workflows name, under their real file names.

The example workflows name what a user downloads (``ideogram4-int8-w8a8.safetensors``,
``ideogram4_fp8_scaled.safetensors`` + ``ideogram4_unconditional_fp8_scaled.safetensors``, ``flux2-vae.safetensors``,
``qwen3vl_8b_fp8_scaled.safetensors``). Tests and the workflow-building tool put tiny synthetic files with those names
into a ComfyUI base directory, so the workflows load and run unchanged:

* the DiTs are a tiny Ideogram 4 (``example_config``: the real 128 latent channels, 2 blocks, 2 heads of 32; a
  1024x1024 sample is 4096 image tokens, so attention must stay cheap for a CPU): ours are read with their own
  config; ComfyUI's native UNETLoader needs the sizes from ``native_sizes()`` (passed to the test pack through
  ``IDEOGRAM4_TEST_NATIVE_SIZES``, see ``tests/comfy_test_pack``);
* the VAE is a Flux2-layout VAE with a narrow decoder (``bench/flux2_vae.py``);
* there are no text-encoder weights (the real one is 8B parameters): tests feed the conditioning from
  ``cond.safetensors`` through the test-only ``Ideogram4TestConditioning`` node instead of CLIPLoader +
  CLIPTextEncode. ``text_encoder_placeholder=True`` writes an empty placeholder under the real name, only so that
  the file list of CLIPLoader holds it (it is never loaded).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import torch
from comfyui_ideogram4_int8.bench.flux2_vae import FILE_NAME as VAE  # the name the example workflows load
from comfyui_ideogram4_int8.bench.flux2_vae import write_flux2_vae
from safetensors.torch import save_file

W8A8 = "ideogram4-int8-w8a8.safetensors"
FP8 = "ideogram4_fp8_scaled.safetensors"
FP8_UNCOND = "ideogram4_unconditional_fp8_scaled.safetensors"
TEXT_ENCODER = "qwen3vl_8b_fp8_scaled.safetensors"
COND = "cond.safetensors"


def loader_node(dtype: str = "fp32") -> dict:
    """The API-format Ideogram 4 INT8 Loader of the test servers: the two-branch W8A8 file, no base."""
    return {
        "class_type": "Ideogram4Int8Loader",
        "inputs": {
            "weights": "i4_w8a8.safetensors",
            "unconditional_weights": "(second branch of the weights file)",
            "base": "none",
            "unconditional_base": "none",
            "compute_dtype": dtype,
            "gemm_path": "auto",
        },
    }


def example_config():
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config

    return dataclasses.replace(Ideogram4Config.tiny(), in_channels=128, llm_features_dim=64)  # real latent width


def native_sizes() -> dict:
    """The keys of ComfyUI's ``supported_models.Ideogram4.unet_extra_config`` for ``example_config``."""
    cfg = example_config()
    return {
        "num_attention_heads": cfg.num_heads,
        "attention_head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "adaln_dim": cfg.adaln_dim,
        "llm_features_dim": cfg.llm_features_dim,
        "mrope_section": list(cfg.mrope_section),
    }


def native_sizes_env() -> dict[str, str]:
    return {"IDEOGRAM4_TEST_NATIVE_SIZES": json.dumps(native_sizes())}


def two_branch_weights(cfg, seed: int) -> dict[str, dict]:
    """Random float weights of ``cfg`` (an ``Ideogram4Config``) for both branches: conditional from ``seed``,
    unconditional from ``seed + 1``."""
    from comfyui_ideogram4_int8.ideogram4 import synthetic

    return {
        "conditional": synthetic.RandomWeights(cfg, seed).materialize(),
        "unconditional": synthetic.RandomWeights(cfg, seed + 1).materialize(),
    }


def write_example_models(
    base: str | pathlib.Path, seed: int, text_tokens: int = 12, text_encoder_placeholder: bool = False
) -> dict[str, pathlib.Path]:
    """Write every file the example workflows name into ``base/models/...`` (+ ``base/cond.safetensors``)."""
    from comfyui_ideogram4_int8.ideogram4 import synthetic

    base = pathlib.Path(base)
    dits, vaes, tes = (base / "models" / d for d in ("diffusion_models", "vae", "text_encoders"))
    for d in (dits, vaes, tes):
        d.mkdir(parents=True, exist_ok=True)
    cfg = example_config()
    weights = two_branch_weights(cfg, seed)
    out = {
        "w8a8": synthetic.write_w8a8(dits / W8A8, weights, cfg),
        "fp8": synthetic.write_comfy_fp8(dits / FP8, weights["conditional"], cfg),
        "fp8_unconditional": synthetic.write_comfy_fp8(dits / FP8_UNCOND, weights["unconditional"], cfg),
        "vae": pathlib.Path(write_flux2_vae(vaes / VAE, seed=seed)),
    }
    g = torch.Generator().manual_seed(seed)
    save_file({"cond": torch.randn(1, text_tokens, cfg.llm_features_dim, generator=g)}, str(base / COND))
    out["cond"] = base / COND
    if text_encoder_placeholder:
        (tes / TEXT_ENCODER).write_bytes(b"")
        out["text_encoder"] = tes / TEXT_ENCODER
    return {k: pathlib.Path(v) for k, v in out.items()}


def example_server(with_models: bool, seed: int, args: tuple[str, ...] = ()):
    """An unstarted ComfyUI (``tests/comfyui_server.py``) with this pack, the test pack, the native sizes for the test
    pack and (``with_models``) every file the example workflows name: the server of
    ``tests/comfyui/test_example_workflows_comfyui.py`` and of ``tests/browser/regenerate_workflows.py``. ``args``:
    extra ComfyUI arguments (``("--front-end-root", <static folder>)`` for another frontend)."""
    from comfyui_server import WITH_TEST_PACK, ComfyUIServer

    def setup(base):
        if with_models:
            write_example_models(base, seed, text_encoder_placeholder=True)

    return ComfyUIServer(
        packs=WITH_TEST_PACK,
        setup=setup,
        env=native_sizes_env(),
        args=tuple(args),
    )


if __name__ == "__main__":  # python tests/workflow_models.py <base dir>: files for a hand-started ComfyUI
    import sys

    paths = write_example_models(sys.argv[1], seed=0, text_encoder_placeholder=True)
    print(json.dumps({k: str(v) for k, v in paths.items()}, indent=1))
    print("start ComfyUI with IDEOGRAM4_TEST_NATIVE_SIZES=" + json.dumps(json.dumps(native_sizes())))
