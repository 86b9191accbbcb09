"""A synthetic Flux2 VAE file that ComfyUI's VAELoader detects as Flux2: the benchmarks' VAE Decode after each image
(``--decode``, at the real width) and the tests' stand-in for ``flux2-vae.safetensors`` (narrow, fast on a CPU).

How ComfyUI recognises a Flux2 VAE (``comfy/sd.py`` ``VAE.__init__``, the ``decoder.conv_in.weight`` branch):
``decoder.conv_in.weight`` has 32 input channels (z_channels = 32, 4-D), ``bn.running_mean`` exists
(``batch_norm_latent``: latents are 2x2-patchified to 128 channels and normalised with the running stats, so the
latent is 128 channels at 1/16 of the image side), ``post_quant_conv.weight`` exists (``AutoencoderKL``,
``embed_dim`` = its input channels). ``ch_mult`` is fixed at [1, 2, 4, 4] (the ``down.2`` / ``up.3`` keys decide
that), ``num_res_blocks`` at 2.

What can be small: the decoder width. ComfyUI takes it from the file (``decoder.conv_in.weight.shape[0] //
ch_mult[-1]``), so ``decoder_ch`` here sets it; GroupNorm uses 32 groups, so 32 is the smallest width that works
(the real file uses 128, ``REAL_DECODER_CH``: the benchmark's decode then has the real one's work and memory request).
The encoder's width is fixed at 128 in ComfyUI's config; the encoder is only needed to encode images, so its weights
are left out (ComfyUI logs them as missing VAE keys and builds it uninitialised, so the VAE still takes the real
one's memory) — decoding, which is all the example workflows and the benchmark do, uses only what this file holds.

``load`` and ``decode`` need ComfyUI importable (``comfy`` on ``sys.path``).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file

Z_CHANNELS = 32
CH_MULT = (1, 2, 4, 4)
NUM_RES_BLOCKS = 2
LATENT_CHANNELS = 4 * Z_CHANNELS  # 2x2 patchify in the batch-norm latent path
REAL_DECODER_CH = 128  # the decoder width of the released flux2-vae
FILE_NAME = "flux2-vae.safetensors"  # the name users download it under


def flux2_vae_state(decoder_ch: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    """Decoder, post/quant convs and latent batch-norm stats of a Flux2-layout VAE, seeded random weights.

    Conv weights are scaled by 1/sqrt(fan_in) so activations stay O(1) through the decoder; norms start at
    identity; the batch-norm running stats are non-trivial (var > 0) so the de-normalisation is exercised.
    """
    if decoder_ch < 32 or decoder_ch % 32:
        raise ValueError(
            f"decoder_ch={decoder_ch}: ComfyUI's VAE uses GroupNorm(32), so the decoder width must be a multiple of 32"
        )
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}

    def conv(name: str, cin: int, cout: int, k: int) -> None:
        sd[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=g) / (cin * k * k) ** 0.5
        sd[f"{name}.bias"] = torch.randn(cout, generator=g) * 0.01

    def norm(name: str, c: int) -> None:
        sd[f"{name}.weight"] = torch.ones(c)
        sd[f"{name}.bias"] = torch.zeros(c)

    def resnet(name: str, cin: int, cout: int) -> None:
        norm(f"{name}.norm1", cin)
        conv(f"{name}.conv1", cin, cout, 3)
        norm(f"{name}.norm2", cout)
        conv(f"{name}.conv2", cout, cout, 3)
        if cin != cout:
            conv(f"{name}.nin_shortcut", cin, cout, 1)

    block_in = decoder_ch * CH_MULT[-1]
    conv("decoder.conv_in", Z_CHANNELS, block_in, 3)
    resnet("decoder.mid.block_1", block_in, block_in)
    norm("decoder.mid.attn_1.norm", block_in)
    for proj in ("q", "k", "v", "proj_out"):
        conv(f"decoder.mid.attn_1.{proj}", block_in, block_in, 1)
    resnet("decoder.mid.block_2", block_in, block_in)
    for level in reversed(range(len(CH_MULT))):
        block_out = decoder_ch * CH_MULT[level]
        for i in range(NUM_RES_BLOCKS + 1):
            resnet(f"decoder.up.{level}.block.{i}", block_in, block_out)
            block_in = block_out
        if level != 0:
            conv(f"decoder.up.{level}.upsample.conv", block_in, block_in, 3)
    norm("decoder.norm_out", block_in)
    conv("decoder.conv_out", block_in, 3, 3)
    conv("post_quant_conv", Z_CHANNELS, Z_CHANNELS, 1)
    conv("quant_conv", 2 * Z_CHANNELS, 2 * Z_CHANNELS, 1)
    sd["bn.running_mean"] = torch.randn(LATENT_CHANNELS, generator=g) * 0.1
    sd["bn.running_var"] = torch.rand(LATENT_CHANNELS, generator=g) + 0.5
    sd["bn.num_batches_tracked"] = torch.tensor(1000, dtype=torch.int64)
    return sd


def write_flux2_vae(path: str | os.PathLike, decoder_ch: int = 32, seed: int = 0) -> str:
    """Write :func:`flux2_vae_state` as safetensors (fp32); returns the path."""
    save_file(flux2_vae_state(decoder_ch, seed), str(path))
    return str(path)


def load(path: str | os.PathLike):
    """The VAE object as ComfyUI's VAELoader makes it from the file: ``comfy.sd.VAE`` on its state dict and metadata."""
    import comfy.sd
    import comfy.utils

    import nodes  # noqa: F401 - VAE Decode's module, imported here so that no timed decode pays for its import

    sd, metadata = comfy.utils.load_torch_file(str(path), return_metadata=True)
    vae = comfy.sd.VAE(sd=sd, metadata=metadata)
    vae.throw_exception_if_invalid()
    return vae


def decode(vae, latent: torch.Tensor) -> torch.Tensor:
    """The IMAGE of ``latent`` (the sampler's LATENT samples), through ComfyUI's own VAE Decode node."""
    import nodes

    return nodes.VAEDecode().decode(vae, {"samples": latent})[0]
