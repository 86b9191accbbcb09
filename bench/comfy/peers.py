"""The peers the ComfyUI benchmark compares: what each loads and how (``PEERS``, ``PEER_ENV``), the synthetic files
of each layout, a peer's two MODELs, their compiled clones (``COMPILE_MODES``) and a run through either sampler."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time

import torch

from .device import GIB

WIDTH = HEIGHT = 1024
TEXT_TOKENS = 512
PEERS = {  # name: (layout, how it loads)
    "native-bf16": ("bf16", "native"),
    "native-fp8": ("fp8", "native"),
    "native-fp8-fast": ("fp8", "native-fast"),
    "native-fp8-ck-attention": ("fp8", "native"),  # ComfyUI's --use-ck-attention: comfy-kitchen's INT8 attention
    "ours-fp8-patch": ("fp8", "patch"),
    "native-int8-convrot": ("int8_convrot", "native"),
    "ours-int8-convrot": ("int8_convrot", "loader"),
    "ours-w8a8": ("w8a8", "loader"),
    "ours-w8a8-lora": ("w8a8", "loader-lora"),
    "ours-w8a8-fp8-protected": ("w8a8", "loader-fp8"),  # the loader's protected_layers = fp8 (triton-fp8 w2)
    "ours-w8a8-two-gpus": ("w8a8", "loader-two-gpus"),  # the unconditional MODEL on cuda:1 (Branch Device node)
    "ours-w8a8-graphs": ("w8a8", "loader"),  # one card with CUDA graphs asked for (the default: on)
    "ours-w8a8-eager": ("w8a8", "loader"),  # one card without CUDA graphs (the eager pass's host time)
    "ours-w8a8-two-gpus-eager": ("w8a8", "loader-two-gpus"),  # two cards without them
    "ours-w8a8-blocks": ("w8a8", "loader"),  # low-VRAM streaming of whole blocks (A/B against pieces)
    "ours-w8a8-comfy-norms": ("w8a8", "loader"),  # the blocks' norms as ComfyUI's ops (A/B against the fused kernel)
    "ours-w8a8-no-handoff": ("w8a8", "loader"),  # the fused norms, the linears quantize their inputs (A/B)
    "ours-w8a8-conds-per-call": ("w8a8", "loader"),  # the context cast to the GPU in every call (A/B, --sampler native)
    "ours-w8a8-no-park": ("w8a8", "loader"),  # unloaded whole counts as unloaded (A/B of the prompt cycle)
    "ours-w8a8-pin-in-place": ("w8a8", "loader"),  # streamed weights pinned in their file mapping (A/B, first image)
    "ours-w8a8-no-pin-ahead": ("w8a8", "loader"),  # weights pinned only where streamed, not after the load (A/B)
    "ours-w8a8-upload-overlap": ("w8a8", "loader"),  # the upload queued beside the first pass (upload=overlap)
}
PEER_COMFY_ARGS = {  # ComfyUI command-line options a peer runs under: read when ComfyUI is imported, so --vram only
    "native-fp8-ck-attention": {"use_ck_attention": True},
}
PEER_ENV = {  # the pack's switches a peer runs under (set for it, cleared for the next)
    "ours-w8a8-graphs": {"IDEOGRAM4_INT8_CUDA_GRAPHS": "on"},
    "ours-w8a8-eager": {"IDEOGRAM4_INT8_CUDA_GRAPHS": "off"},
    "ours-w8a8-two-gpus-eager": {"IDEOGRAM4_INT8_CUDA_GRAPHS": "off"},
    "ours-w8a8-blocks": {"IDEOGRAM4_INT8_EXPERIMENTS": "stream-whole-blocks"},
    "ours-w8a8-comfy-norms": {"IDEOGRAM4_INT8_EXPERIMENTS": "block-norms=comfyui"},
    "ours-w8a8-no-handoff": {"IDEOGRAM4_INT8_EXPERIMENTS": "block-norms=no-handoff"},
    "ours-w8a8-conds-per-call": {"IDEOGRAM4_INT8_EXPERIMENTS": "no-resident-conds"},
    "ours-w8a8-no-park": {"IDEOGRAM4_INT8_EXPERIMENTS": "park=off"},
    "ours-w8a8-pin-in-place": {"IDEOGRAM4_INT8_EXPERIMENTS": "pin-copy=off"},
    "ours-w8a8-no-pin-ahead": {"IDEOGRAM4_INT8_EXPERIMENTS": "pin-ahead=off"},
    "ours-w8a8-upload-overlap": {"IDEOGRAM4_INT8_EXPERIMENTS": "upload=overlap"},
}
TEXT_ENCODER = "text-encoder"  # the prompt cycle's text encoder file (--prompts), written like a layout
VAE = "vae"  # the VAE file each image is decoded with (--decode), written like a layout
LAYOUTS = ("bf16", "fp8", "int8_convrot", "w8a8")
COMPILE_MODES = ("default", "cudagraphs", "blocks", "max-autotune-no-cudagraphs", "reduce-overhead")
SAMPLERS = ("pack", "native")


def write_layout(layout: str, config, workdir: pathlib.Path, seed: int) -> dict[str, pathlib.Path]:
    """{branch: file} of one layout, from the same seeded weights every layout derives from (``TEXT_ENCODER``: the
    synthetic text encoder, ``bench/text_encoder.py``; ``VAE``: the synthetic Flux2 VAE, ``bench/flux2_vae.py``, at
    the real decoder width)."""
    from ...ideogram4 import synthetic

    if layout == VAE:
        from .. import flux2_vae

        path = layout_files(VAE, workdir)["vae"]
        flux2_vae.write_flux2_vae(path, decoder_ch=flux2_vae.REAL_DECODER_CH, seed=seed)
        print(f"[{layout}] wrote {path.stat().st_size / GIB:.2f} GiB", flush=True)
        return {"vae": path}
    if layout == TEXT_ENCODER:
        from .. import text_encoder

        t0 = time.perf_counter()
        path = text_encoder.write(workdir, seed)
        print(f"[{layout}] wrote {path.stat().st_size / GIB:.1f} GiB in {time.perf_counter() - t0:.0f} s", flush=True)
        return {"text_encoder": path}

    gen = "cuda" if torch.cuda.is_available() else "cpu"
    weights = {
        b: synthetic.RandomWeights(config, seed + i, device=gen) for i, b in enumerate(("conditional", "unconditional"))
    }
    t0 = time.perf_counter()
    files = layout_files(layout, workdir)
    if layout == "w8a8":
        synthetic.write_w8a8(files["conditional"], weights, config, protected=synthetic.default_protected(config))
    else:
        for b, w in weights.items():
            path = files[b]
            if layout == "bf16":
                synthetic.write_float(path, w, config)
            elif layout == "fp8":
                synthetic.write_comfy_fp8(path, w, config, quantized=_block_linears(config))
            else:
                synthetic.write_comfy_int8(path, w, config, quantized=_block_linears(config))
    size = sum(f.stat().st_size for f in set(files.values())) / GIB
    print(f"[{layout}] wrote {size:.1f} GiB in {time.perf_counter() - t0:.0f} s", flush=True)
    return files


def config_for(a):
    """The architecture a run benchmarks: ``--config``'s, with ``--layers`` blocks when given."""
    from ...ideogram4.config import Ideogram4Config

    config = getattr(Ideogram4Config, a.config)()
    return dataclasses.replace(config, num_layers=a.layers) if a.layers else config


def each_layout(peers: list[str], write, keep: bool = False):
    """(layout, its peers, its files) for every layout some peer of ``peers`` loads, files from ``write(layout)``;
    a layout's files are deleted when the caller moves on to the next (or stops), so only one is on disk at a time,
    unless ``keep``."""
    for layout in LAYOUTS:
        mine = [p for p in peers if PEERS[p][0] == layout]
        if not mine:
            continue
        files = write(layout)
        try:
            yield layout, mine, files
        finally:
            for f in set(files.values()) if not keep else ():
                f.unlink(missing_ok=True)


def layout_files(layout: str, workdir: pathlib.Path) -> dict[str, pathlib.Path]:
    """{branch: file} where ``write_layout`` writes ``layout`` ({"text_encoder": file} for ``TEXT_ENCODER``,
    {"vae": file} for ``VAE``)."""
    if layout == VAE:
        from ..flux2_vae import FILE_NAME

        return {"vae": workdir / FILE_NAME}
    if layout == TEXT_ENCODER:
        from ..text_encoder import FILE_NAME

        return {"text_encoder": workdir / FILE_NAME}
    if layout == "w8a8":
        path = workdir / "ideogram4-int8-w8a8.safetensors"
        return {"conditional": path, "unconditional": path}
    return {
        b: workdir / f"ideogram4{'' if b == 'conditional' else '_unconditional'}_{layout}.safetensors"
        for b in ("conditional", "unconditional")
    }


def _block_linears(config) -> list[str]:
    """The layers ComfyUI's quantized Ideogram 4 files quantize: the six linears of every block."""
    return [s.name for s in config.linears() if s.name.startswith("layers.")]


def load_models(peer: str, files: dict, config):
    """(conditional, unconditional) MODELs of one peer, and notes."""
    import comfy.sd
    from comfy.cli_args import PerformanceFeature, args

    from ...kernels import settings

    layout, how = PEERS[peer]
    notes = {}
    for name in {n for env in PEER_ENV.values() for n in env}:  # read at load and at each run
        os.environ.pop(name, None)
    os.environ.update(PEER_ENV.get(peer, {}))
    settings.reload()
    if how.startswith("native"):
        fast = args.fast
        args.fast = {PerformanceFeature.Fp8MatrixMultiplication} if how == "native-fast" else set()
        try:
            models = tuple(comfy.sd.load_diffusion_model(str(files[b])) for b in ("conditional", "unconditional"))
        finally:
            args.fast = fast
        if layout == "int8_convrot":
            notes["comfy_kitchen"] = _comfy_kitchen_backend()
        return models, notes
    if how == "patch":
        from ...nodes.patch_nodes import patch_model

        out = []
        for b in ("conditional", "unconditional"):
            native = comfy.sd.load_diffusion_model(str(files[b]))
            patched, report = patch_model(native, b, None)
            del native
            out.append(patched)
            notes[f"{b}_patch"] = f"{report.path_counts() if hasattr(report, 'path_counts') else report}"[:300]
        return tuple(out), notes
    from ...nodes.loader_nodes import load_branch

    out = []
    for b in ("conditional", "unconditional"):
        protected = "fp8" if how == "loader-fp8" else "bf16"
        patcher, state, paths, dtype = load_branch(str(files[b]), b, None, "auto", None, None, protected)
        state.clear()
        out.append(patcher)
    if how == "loader-lora":
        out = [_with_lora(m, config, seed=i) for i, m in enumerate(out)]
        notes["lora"] = "rank 32 on every block linear, strength 1.0, merged in full-load mode"
    if how == "loader-two-gpus":
        from ...nodes.branch_device_nodes import place

        placed, note = place(out[1], "second GPU")
        if placed is out[1]:
            raise RuntimeError(f"{peer} needs two CUDA GPUs: {note}")
        out[1] = placed
        notes["placement"] = note
    return tuple(out), notes


def _with_lora(model, config, seed: int, rank: int = 32):
    import comfy.lora

    g = torch.Generator().manual_seed(1000 + seed)
    sd = {}
    for spec in config.linears():
        if not spec.name.startswith("layers."):
            continue
        key = f"diffusion_model.{spec.name}"
        sd[f"{key}.lora_up.weight"] = (torch.randn(spec.out_features, rank, generator=g) * 1e-3).bfloat16()
        sd[f"{key}.lora_down.weight"] = (torch.randn(rank, spec.in_features, generator=g) * 1e-2).bfloat16()
    key_map = comfy.lora.model_lora_keys_unet(model.model, {})
    patches = comfy.lora.load_lora(sd, key_map)
    patched = model.clone()
    loaded = patched.add_patches(patches, 1.0)
    if len(loaded) != len(patches):
        raise RuntimeError(f"LoRA: {len(loaded)} of {len(patches)} patches applied")
    return patched


def _comfy_kitchen_backend() -> str:
    """Which comfy-kitchen backend ComfyUI's int8 layers get (the CUDA one is the real peer, eager a fallback)."""
    try:
        import comfy_kitchen as ck
        from comfy_kitchen.registry import registry

        backends = registry.list_backends()
        avail = sorted(n for n, b in backends.items() if b["available"] and not b["disabled"])
        why = {n: b["unavailable_reason"] for n, b in backends.items() if b["unavailable_reason"]}
        first = registry.get_capable_backend("int8_linear")
        return f"comfy-kitchen {getattr(ck, '__version__', '?')}: int8_linear on {first}; available {avail}" + (
            f"; unavailable {why}" if why else ""
        )
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        return f"comfy-kitchen backend unknown: {type(exc).__name__}: {exc}"


def sample_with(sampler: str, models, ctx, plan, size: int, seed: int) -> torch.Tensor:
    """One run's latent through the pack's sampler node (``pack``) or as ComfyUI's own nodes run it (``native``):
    *Dual Model CFG Guider* (the negative input unconnected: image-only) and *SamplerCustomAdvanced* with Euler on the
    plan's sigmas, a constant cfg (the plan's first), the CONDITIONING where the text encoder left it."""
    from ...nodes import sampler_nodes

    if sampler == "pack":
        return sampler_nodes.sample(models[0], models[1], [[ctx, {}]], plan, size, size, seed)
    import comfy.samplers
    from comfy_extras import nodes_custom_sampler as ncs

    guider = ncs.DualModelGuider.execute(
        model=models[0], positive=[[ctx, {}]], cfg=float(plan.guidance[0]), model_negative=models[1]
    ).result[0]
    latent = sampler_nodes.empty_latent(models[0], size, size)  # the pack sampler's start: the same A/B operands
    out = ncs.SamplerCustomAdvanced.execute(
        noise=ncs.Noise_RandomNoise(seed),
        guider=guider,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=plan.sigmas,
        latent_image={"samples": latent},
    ).result[0]
    return out["samples"]


def compiled_clones(models, mode: str):
    """Clones of ``models`` compiled the ``mode`` way (``COMPILE_MODES``), as ComfyUI's compile nodes do it: a clone
    rebuilt non-dynamic, ``set_torch_compile_wrapper`` applied at sample time, the guard filter that skips
    ``transformer_options`` (TorchCompileModel's) wherever the backend is inductor or cudagraphs as the node sets it."""
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    def skip_transformer_options(guard_entries):
        return [("transformer_options" not in entry.name) for entry in guard_entries]

    node = {"options": {"guard_filter_fn": skip_transformer_options}}
    out = []
    for m in models:
        c = m.clone(disable_dynamic=True)  # as the node does (a dynamic-VRAM MODEL is rebuilt non-dynamic)
        if mode in ("default", "cudagraphs"):  # TorchCompileModel's two backend choices
            set_torch_compile_wrapper(model=c, backend="inductor" if mode == "default" else mode, **node)
        elif mode == "blocks":  # one compiled module per transformer block, the rest of the model eager
            n = len(c.get_model_object("diffusion_model.layers"))
            keys = [f"diffusion_model.layers.{i}" for i in range(n)]
            set_torch_compile_wrapper(model=c, backend="inductor", keys=keys, **node)
        else:
            set_torch_compile_wrapper(model=c, backend="inductor", mode=mode)
        out.append(c)
    return tuple(out)


def compiled_frames() -> int:
    """Frames dynamo has compiled in this process so far (a growing count during timed steps is a recompile)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
