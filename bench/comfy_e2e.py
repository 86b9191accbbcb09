"""End-to-end through ComfyUI: what a ComfyUI user runs, against native ComfyUI on the same files, in one run.

    COMFYUI_DIR=/path/to/ComfyUI python -m comfyui_ideogram4_int8.bench.comfy_e2e --workdir /tmp/i4 \
        [--peers native-bf16,...] [--layers 34] [--out results.json] [--latents DIR]

Full-size synthetic Ideogram 4 weights (seeded, with outlier channels; ``ideogram4.synthetic``) are written to
``--workdir`` in each layout users have, one layout at a time (deleted after its peers ran):

  bf16           plain bf16 files, one per branch                  (native-bf16)
  fp8            ComfyUI fp8_scaled (comfy_quant), one per branch  (native-fp8, native-fp8-fast, ours-fp8-patch)
  int8_convrot   ComfyUI int8_tensorwise + ConvRot, one per branch (native-int8-convrot, ours-int8-convrot)
  w8a8           transformerlab W8A8, both branches in one file, a SmoothQuant vector on every quantized layer
                 (w1 and w3 different), 17 bf16-protected w2                   (ours-w8a8, ours-w8a8-lora)

Each peer loads both branches through ComfyUI (native: ``comfy.sd.load_diffusion_model``, what Load Diffusion
Model does; ours: the pack's loader / Patch node functions), samples 1024x1024 Default 20 through the pack's
sampler node function (ComfyUI's guider, Euler sampler and model management; official asymmetric CFG) after a
2-step warm-up (autotuning, compilation), and reports per path: the Default-20 time and its per-step mean,
peak VRAM during sampling (both branches resident), the latent's cosine against native bf16, and which GEMM
paths ran. ``native-fp8-fast`` is native fp8 with ComfyUI's ``--fast fp8_matrix_mult``; ``native-int8-convrot``
runs ComfyUI's int8 path through comfy-kitchen (its backend is reported). ``ours-w8a8-lora`` merges a synthetic
rank-32 LoRA on every block linear first (full-load mode). ``--layers`` builds fewer blocks (smoke runs only).

``--compile MODE[,MODE]``: after a peer's eager run, the same MODELs compiled the way users compile them in ComfyUI
(``comfy_api.torch_helpers.set_torch_compile_wrapper``, applied at sample time), labelled "<peer> compiled:<mode>":
the warm-up's extra wall time over the eager warm-up as ``compile_s``, the step ratio to the eager peer, and ratios
to the native peers compiled the same way. The modes (``COMPILE_MODES``): ``default`` is TorchCompileModel's
inductor setting, ``cudagraphs`` its other backend choice; ``blocks`` compiles each transformer block on its own
with inductor (KJNodes' "transformer blocks only"); ``max-autotune-no-cudagraphs`` and ``reduce-overhead`` are
inductor modes of the whole diffusion model (the latter replays CUDA graphs). With ``--vram 0`` every compiled run
is a process of its own too (``comfy_cards``), and reports the frames dynamo compiled during its timed steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import pathlib
import sys
import time

import torch

from .timing import ClockWatch

GIB = 1024**3
WIDTH = HEIGHT = 1024
TEXT_TOKENS = 512
PEERS = {  # name: (layout, how it loads)
    "native-bf16": ("bf16", "native"),
    "native-fp8": ("fp8", "native"),
    "native-fp8-fast": ("fp8", "native-fast"),
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
}
PEER_ENV = {  # the pack's switches a peer runs under (set for it, cleared for the next)
    "ours-w8a8-graphs": {"IDEOGRAM4_INT8_CUDA_GRAPHS": "on"},
    "ours-w8a8-eager": {"IDEOGRAM4_INT8_CUDA_GRAPHS": "off"},
    "ours-w8a8-two-gpus-eager": {"IDEOGRAM4_INT8_CUDA_GRAPHS": "off"},
    "ours-w8a8-blocks": {"IDEOGRAM4_INT8_EXPERIMENTS": "stream-whole-blocks"},
    "ours-w8a8-comfy-norms": {"IDEOGRAM4_INT8_EXPERIMENTS": "block-norms=comfyui"},
    "ours-w8a8-no-handoff": {"IDEOGRAM4_INT8_EXPERIMENTS": "block-norms=no-handoff"},
    "ours-w8a8-conds-per-call": {"IDEOGRAM4_INT8_EXPERIMENTS": "no-resident-conds"},
}
LAYOUTS = ("bf16", "fp8", "int8_convrot", "w8a8")
COMPILE_MODES = ("default", "cudagraphs", "blocks", "max-autotune-no-cudagraphs", "reduce-overhead")


def comfy_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m comfyui_ideogram4_int8.bench.<module>`` (``doc``: its description), with the
    ``--comfyui`` option every ComfyUI benchmark takes."""
    p = argparse.ArgumentParser(
        prog=f"python -m comfyui_ideogram4_int8.bench.{module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--comfyui", default=os.environ.get("COMFYUI_DIR"), help="ComfyUI tree (default $COMFYUI_DIR)")
    return p


def _parse(argv):
    p = comfy_parser("comfy_e2e", __doc__)
    p.add_argument("--workdir", required=True, help="where the synthetic files go (~40 GB free for bf16)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {list(PEERS)}")
    p.add_argument("--layers", type=int, default=None, help="fewer blocks (smoke runs only)")
    p.add_argument(
        "--config",
        default="full",
        choices=("full", "demo"),
        help="demo: the tiny demo model, 256 px, on any device (a smoke run of this script; no numbers to report)",
    )
    p.add_argument("--size", type=int, default=None, help="width = height in pixels (1024; smoke runs only)")
    p.add_argument("--steps", type=int, default=20, help="Default 20 (the preset's steps; fewer for smoke runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference-latent", default=None, help="native-bf16 latent (.pt) of an earlier call")
    p.add_argument("--latents", default=None, help="save each peer's latent here (.pt per peer)")
    p.add_argument("--out", default=None, help="JSON results file")
    p.add_argument(
        "--compile",
        default="",
        help=f"comma list of {list(COMPILE_MODES)}: also run each peer compiled that way (ComfyUI's TorchCompileModel)",
    )
    p.add_argument(
        "--vram",
        default="",
        help="comma list of card sizes to emulate, in GiB (0: the whole GPU): "
        "each peer runs once per size, each run in a process of its own (a hard cap: the rest of the "
        "GPU is taken before ComfyUI starts, so its loading decisions and every allocation see that card)",
    )
    p.add_argument(
        "--setup",
        default="server",
        choices=("server", "plain"),
        help="server (default): ComfyUI's "
        "model management as main.py sets it up (DynamicVRAM through comfy-aimdo where it initializes, "
        "async offload); plain: ComfyUI imported as a library",
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="with --vram: one more run of --steps steps with --kernel-steps steps from its middle profiled: their "
        "per-kernel table per step in each run's entry, and what the run had beyond its steps (bench/kernel_table.py)",
    )
    p.add_argument(
        "--kernel-steps",
        type=int,
        default=4,
        help="with --kernels: how many steps to profile (default 4; fewer in a short run, the first step left out from "
        "2 steps on, the last from 3 on)",
    )
    p.add_argument(
        "--host-profile",
        action="store_true",
        help="with --vram: the Python functions of one 2-step run by host time (cProfile) in each run's entry",
    )
    p.add_argument(
        "--sampler",
        default="pack",
        choices=SAMPLERS,
        help="pack (default): every peer through the pack's sampler node; native: through ComfyUI's own Dual Model "
        "CFG Guider + SamplerCustomAdvanced (Euler, the same sigmas, a constant cfg), as native Ideogram 4 "
        "workflows sample",
    )
    p.add_argument(
        "--images",
        type=int,
        default=3,
        help="with --vram: sampling runs after the load, back to back as a user makes them (each a new seed, the last "
        "with the first's again, to check a replayed run gives the same latent): the first after the load and the "
        "warm ones, in seconds per image (default 3)",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="with --vram: one more run of the first pack peer, first, with empty kernel caches (autotuning and "
        "compilation in its first image), reported as the first-ever image",
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="with --vram: no throw-away run before the reported ones (the kernel caches in --workdir are warm from an "
        "earlier run on this machine)",
    )
    p.add_argument(
        "--reuse-files",
        action="store_true",
        help="with --vram: keep the synthetic files in --workdir after the run and use them when they are there "
        "(written by an earlier run with the same --seed and --layers)",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # JSON of one run (peer, cap, files)
    a = p.parse_args(argv)
    a.peers = [x for x in a.peers.split(",") if x]
    try:
        a.vram = [float(x) for x in a.vram.split(",") if x.strip()]
    except ValueError:
        p.error("--vram: a comma list of GiB numbers, e.g. 0,24,16,12,8")
    if any(v < 0 or (0 < v < 4) for v in a.vram):
        p.error("--vram: each size is 0 (the whole GPU) or at least 4 GiB")
    if a.kernel_steps < 1:
        p.error("--kernel-steps: at least 1")
    if a.images < 1:
        p.error("--images: at least 1")
    a.compile = [x for x in a.compile.split(",") if x]
    if [x for x in a.compile if x not in COMPILE_MODES]:
        p.error(f"--compile: choose from {list(COMPILE_MODES)}")
    if a.compile and any(a.vram) and not a.child:  # streaming under torch.compile is not measured
        p.error("--compile with --vram runs on the whole GPU only (--vram 0): emulated cards run eager peers")
    unknown = [x for x in a.peers if x not in PEERS]
    if unknown:
        p.error(f"--peers: unknown {unknown}; choices: {list(PEERS)}")
    if not a.comfyui:
        p.error("--comfyui (or COMFYUI_DIR) must name a ComfyUI tree")
    return a


def _import_comfyui(root: str):
    root = str(pathlib.Path(root).resolve())
    sys.path.insert(0, root)
    argv, sys.argv = sys.argv, [sys.argv[0]]
    try:
        from comfy.cli_args import args  # ComfyUI's defaults (it parses the command line only under main.py)

        args.cpu = not torch.cuda.is_available()
        import comfy.model_management  # noqa: F401
    finally:
        sys.argv = argv


def _write_layout(layout: str, config, workdir: pathlib.Path, seed: int) -> dict[str, pathlib.Path]:
    """{branch: file} of one layout, from the same seeded weights every layout derives from."""
    from ..ideogram4 import synthetic

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
    from ..ideogram4.config import Ideogram4Config

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
    """{branch: file} where ``_write_layout`` writes ``layout``."""
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


def _load(peer: str, files: dict, config):
    """(conditional, unconditional) MODELs of one peer, and notes."""
    import comfy.sd
    from comfy.cli_args import PerformanceFeature, args

    from ..kernels import settings

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
        from ..nodes.patch_nodes import patch_model

        out = []
        for b in ("conditional", "unconditional"):
            native = comfy.sd.load_diffusion_model(str(files[b]))
            patched, report = patch_model(native, b, None)
            del native
            out.append(patched)
            notes[f"{b}_patch"] = f"{report.path_counts() if hasattr(report, 'path_counts') else report}"[:300]
        return tuple(out), notes
    from ..nodes.loader_nodes import load_branch

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
        from ..nodes.branch_device_nodes import place

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


SAMPLERS = ("pack", "native")


def sample_with(sampler: str, models, ctx, plan, size: int, seed: int) -> torch.Tensor:
    """One run's latent through the pack's sampler node (``pack``) or as ComfyUI's own nodes run it (``native``):
    *Dual Model CFG Guider* (the negative input unconnected: image-only) and *SamplerCustomAdvanced* with Euler on the
    plan's sigmas, a constant cfg (the plan's first), the CONDITIONING where the text encoder left it."""
    from ..nodes import sampler_nodes

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


def _sample(models, ctx, steps: int, seed: int, size: int, sampler: str = "pack") -> tuple[torch.Tensor, float]:
    from ..ideogram4 import sampling_args

    plan = (
        sampling_args.plan_sampling("Default 20", size, size)
        if steps == 20
        else sampling_args.plan_sampling("custom", size, size, steps=steps, polish_steps=min(2, steps - 1))
    )
    _sync()
    t0 = time.perf_counter()
    latent = sample_with(sampler, models, ctx, plan, size, seed)
    _sync()
    return latent.float().cpu(), (time.perf_counter() - t0) * 1e3


def _compiled(models, mode: str):
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


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / GIB, 2) if torch.cuda.is_available() else None


def _peaks_per_card() -> dict[str, float] | None:
    """Peak allocated GiB of every card (a two-GPU peer holds one branch on each)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    return {f"cuda:{i}": round(torch.cuda.max_memory_allocated(i) / GIB, 2) for i in range(torch.cuda.device_count())}


def _reset_peaks() -> None:
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)


def run(argv=None) -> dict:
    a = _parse(argv)
    if a.child:
        from . import comfy_cards

        return comfy_cards.child(a)
    if a.vram:
        from . import comfy_cards

        return comfy_cards.parent(a)
    if not torch.cuda.is_available() and a.config == "full" and not (a.layers and a.size):
        raise SystemExit(
            "the ComfyUI end-to-end benchmark needs a CUDA GPU (CPU smoke runs: --config demo, or --layers and --size)"
        )
    _import_comfyui(a.comfyui)
    import comfy.model_management
    import triton

    from .. import kernels
    from ..kernels import launch

    config = config_for(a)
    size = a.size or (WIDTH if a.config == "full" else 256)
    workdir = pathlib.Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    tokens = TEXT_TOKENS if a.config == "full" else 16
    ctx = torch.randn(1, tokens, config.llm_features_dim, generator=g).bfloat16()
    result = {
        "info": {
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "comfyui": _comfyui_version(a.comfyui),
            "date": datetime.date.today().isoformat(),
            "command": "python -m comfyui_ideogram4_int8.bench.comfy_e2e " + " ".join(sys.argv[1:]),
            "layers": config.num_layers,
            "size": f"{size}x{size}",
            "text_tokens": TEXT_TOKENS,
            "steps": a.steps,
            "sampler": a.sampler,
            "backends": kernels.backends.report(),
            "cached_launches": launch.status(),
        },
        "peers": {},
    }
    reference = torch.load(a.reference_latent) if a.reference_latent else None
    for layout, peers, files in each_layout(a.peers, lambda layout: _write_layout(layout, config, workdir, a.seed)):
        for peer in peers:
            entry = result["peers"][peer] = {"layout": layout}
            try:
                t0 = time.perf_counter()
                models, notes = _load(peer, files, config)
                entry.update(load_s=round(time.perf_counter() - t0, 1), **notes)
                kernels.REGISTRY.clear()
                # warm-up: autotuning, first loads
                _, eager_warmup_ms = _sample(models, ctx, 2, a.seed, size, a.sampler)
                _reset_peaks()
                with ClockWatch() as watch:
                    latent, ms = _sample(models, ctx, a.steps, a.seed, size, a.sampler)
                entry.update(
                    sm_mhz_median=watch.sm_mhz,
                    watts_median=watch.watts,
                    sample_ms=round(ms, 1),
                    step_ms=round(ms / a.steps, 1),
                    peak_gib=_peak_gib(),
                    peak_gib_per_card=_peaks_per_card(),
                    paths={m: kernels.REGISTRY.counts(m) for m in kernels.REGISTRY.models()},
                )
                if peer == "native-bf16":
                    reference = latent
                if reference is not None:
                    entry["latent_cosine_vs_bf16"] = round(
                        torch.nn.functional.cosine_similarity(
                            latent.flatten().double(), reference.flatten().double(), dim=0
                        ).item(),
                        5,
                    )
                if a.latents:
                    pathlib.Path(a.latents).mkdir(parents=True, exist_ok=True)
                    torch.save(latent, pathlib.Path(a.latents) / f"{peer}.pt")
                print(f"[{peer}] {json.dumps(entry)}", flush=True)
                for mode in a.compile:
                    _run_compiled(result, peer, mode, models, ctx, a, size, reference, eager_warmup_ms)
            except Exception as exc:  # noqa: BLE001 - one peer failing keeps the others' numbers
                entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
                print(f"[{peer}] FAILED {entry['error']}", flush=True)
            finally:
                models = None
                comfy.model_management.unload_all_models()
                gc.collect()
                comfy.model_management.soft_empty_cache()
            if a.out:
                pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
    _ratios(result)
    print_table(result)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
        plot(result, pathlib.Path(a.out).with_suffix(".png"))
    return result


def _run_compiled(result, peer, mode, models, ctx, a, size, reference, eager_warmup_ms) -> None:
    """``peer`` compiled in ``mode``: one more entry of ``result["peers"]`` (an error there, not raised)."""
    import comfy.model_management
    import torch._dynamo

    from .. import kernels

    name = f"{peer} compiled:{mode}"
    entry = result["peers"][name] = {"layout": result["peers"][peer]["layout"], "compiled": mode}
    try:
        torch._dynamo.reset()
        comfy.model_management.unload_all_models()  # the eager MODELs leave the GPU before the compiled clones load
        compiled = _compiled(models, mode)
        kernels.REGISTRY.clear()
        frames = compiled_frames()  # the process's count so far (dynamo's reset keeps its counters)
        _, warm_ms = _sample(compiled, ctx, 2, a.seed, size, a.sampler)  # tracing, code generation, autotuning
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        warm = compiled_frames()
        with ClockWatch() as watch:  # a compiled step is denser than eager: the board may sit lower on its clock
            latent, ms = _sample(compiled, ctx, a.steps, a.seed, size, a.sampler)
        entry.update(
            frames_compiled={"warmup": warm - frames, "timed_steps": compiled_frames() - warm},
            sm_mhz_median=watch.sm_mhz,
            watts_median=watch.watts,
            compile_s=round((warm_ms - eager_warmup_ms) / 1e3, 1),
            sample_ms=round(ms, 1),
            step_ms=round(ms / a.steps, 1),
            peak_gib=_peak_gib(),
            speedup_vs_eager=round(result["peers"][peer]["step_ms"] / (ms / a.steps), 3),
            paths={m: kernels.REGISTRY.counts(m) for m in kernels.REGISTRY.models()},
        )
        if reference is not None:
            entry["latent_cosine_vs_bf16"] = round(
                torch.nn.functional.cosine_similarity(
                    latent.flatten().double(), reference.flatten().double(), dim=0
                ).item(),
                5,
            )
        print(f"[{name}] {json.dumps(entry)}", flush=True)
    except Exception as exc:  # noqa: BLE001 - one compiled peer failing keeps the others' numbers
        entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
        print(f"[{name}] FAILED {entry['error']}", flush=True)
    finally:
        compiled = None
        torch._dynamo.reset()


def plot(result: dict, png: pathlib.Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    fig = figure(result)
    if fig is not None:
        fig.savefig(png, dpi=110)


TITLE_WIDTH = 95  # characters per title line: fits the 12-inch figure at the suptitle's size with room to spare


def figure(result: dict):
    """The two-panel figure (step time, peak memory) of a run, or None without peers that ran."""
    import textwrap

    import matplotlib.pyplot as plt

    peers = [p for p, e in result["peers"].items() if "step_ms" in e]
    if not peers:
        return None
    # constrained layout makes room for the long peer names and the title, which tight_layout cut at both ends
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    colors = ["tab:gray" if p.startswith("native") else "tab:green" for p in peers]
    ax.barh(peers, [result["peers"][p]["step_ms"] for p in peers], color=colors)
    ax.set_xlabel("ms per sampling step (Default 20 / 20; both branches, CFG, Euler)")
    ax.invert_yaxis()
    bx.barh(peers, [result["peers"][p]["peak_gib"] or 0 for p in peers], color=colors)
    bx.axvline(24, color="tab:red", linestyle="--", label="24 GB card")
    bx.set_xlabel("peak GiB while sampling (both branches resident)")
    bx.invert_yaxis()
    bx.legend()
    info = result["info"]
    lines = [
        f"Ideogram 4 through ComfyUI {info['comfyui']}, {info['size']}, {info['gpu']}",
        f"torch {info['torch']}, triton {info['triton']}; grey: native ComfyUI, green: this pack",
    ]
    fig.suptitle("\n".join(textwrap.fill(line, TITLE_WIDTH) for line in lines))
    return fig


def _comfyui_version(root: str) -> str:
    try:
        text = (pathlib.Path(root) / "comfyui_version.py").read_text()
        return text.split("=")[-1].strip().strip("\"'")
    except OSError:
        return "?"


def _ratios(result: dict) -> None:
    peers = result["peers"]
    for entry in peers.values():
        suffix = f" compiled:{entry['compiled']}" if entry.get("compiled") else ""  # against peers compiled alike
        for ref in ("native-bf16", "native-fp8", "native-fp8-fast", "native-int8-convrot"):
            base = peers.get(ref + suffix, {}).get("step_ms")
            if base and entry.get("step_ms"):
                entry[f"speedup_vs_{ref}"] = round(base / entry["step_ms"], 3)


def print_table(result: dict) -> None:
    info = result["info"]

    def row(e):
        def r(ref):
            return two_places(e, f"speedup_vs_{ref}", "x")

        cos = f"{e['latent_cosine_vs_bf16']:.4f}" if "latent_cosine_vs_bf16" in e else "-"
        return (
            f"{e['step_ms']:>9.1f}{r('native-bf16'):>8}{r('native-fp8'):>7}{r('native-fp8-fast'):>8}"
            f"{r('native-int8-convrot'):>8}{e['sample_ms'] / 1e3:>8.2f}{e['peak_gib'] or 0:>10.2f}{cos:>9}"
        )

    print_runs(
        f"{info['gpu']}, torch {info['torch']}, triton {info['triton']}, ComfyUI {info['comfyui']}, "
        f"{info['layers']} blocks, {info['size']}, {info['steps']} steps",
        ("peer", 46),
        f"{'step ms':>9}{'x bf16':>8}{'x fp8':>7}{'x fp8f':>8}{'x int8':>8}{'D20 s':>8}{'peak GiB':>10}{'cos':>9}",
        result["peers"],
        row,
    )


def two_places(e: dict, key: str, unit: str = "") -> str:
    """``e[key]`` with two decimals (and ``unit``), or '-' where the run has no such value."""
    return f"{e[key]:.2f}{unit}" if key in e else "-"


def print_runs(title: str, name_column, columns: str, runs: dict, row, failed: slice = slice(None, 100)) -> None:
    """A results table (this module's and comfy_cards'): ``title`` after a blank line; the header, ``name_column``
    ((label, width)) then ``columns``; a line a run: its name, then ``row(entry)``, or FAILED and the ``failed``
    part of its error where it did not run."""
    label, width = name_column
    print(f"\n{title}")
    print(f"{label:<{width}}{columns}")
    for name, e in runs.items():
        if "error" in e:
            print(f"{name:<{width}} FAILED: {e['error'][failed]}")
        else:
            print(f"{name:<{width}}{row(e)}")


if __name__ == "__main__":
    run()
