"""End-to-end through ComfyUI: what a ComfyUI user runs, against native ComfyUI on the same files, in one run.

    COMFYUI_DIR=/path/to/ComfyUI python -m comfyui_ideogram4_int8.bench.comfy --workdir /tmp/i4 \
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
is a process of its own too, and reports the frames dynamo compiled during its timed steps.
"""

from __future__ import annotations

import argparse
import os

from . import child, inprocess, parent
from .peers import COMPILE_MODES, PEER_COMFY_ARGS, PEERS, SAMPLERS


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


def parse(argv):
    p = comfy_parser("comfy", __doc__)
    p.add_argument("--workdir", required=True, help="where the synthetic files go (~40 GB free for bf16)")
    p.add_argument(
        "--peers",
        default=",".join(x for x in PEERS if x not in PEER_COMFY_ARGS),
        help=f"comma list of {list(PEERS)} (default: all but {list(PEER_COMFY_ARGS)}, which need --vram)",
    )
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
        "--profile-first",
        action="store_true",
        help="with --vram and --images >= 2: the first image after the load under cProfile (where its host time "
        "goes: loads, plans, eager passes, captures), in its image record",
    )
    p.add_argument(
        "--profile-warm",
        action="store_true",
        help="with --vram and --images >= 3: the second image (the first warm one: with --prompts, its encode too) "
        "under cProfile, in its image record",
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
    p.add_argument(
        "--prompts",
        action="store_true",
        help="with --vram: each image is a prompt cycle as a user makes it: ComfyUI's Ideogram 4 text encoder "
        "(Qwen3-VL 8B fp8 layout, synthetic weights, loaded once per process through ComfyUI's loader) encodes a new "
        "prompt, then the image samples from its features; reports the encode and cycle seconds and whether any "
        "file was read again",
    )
    p.add_argument(
        "--decode",
        action="store_true",
        help="with --vram: after each image, ComfyUI's VAE Decode on its latent as users run it (a Flux2 VAE at the "
        "real decoder width, synthetic weights, bench/flux2_vae.py, loaded once per process as VAELoader loads it); "
        "reports the decode and image-with-decode seconds, and what the decode's memory request did to the MODELs",
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
    if a.decode and not a.vram and not a.child:
        p.error("--decode: decodes in the --vram runs only (a process a run): add --vram, e.g. --vram 0,16")
    a.compile = [x for x in a.compile.split(",") if x]
    if [x for x in a.compile if x not in COMPILE_MODES]:
        p.error(f"--compile: choose from {list(COMPILE_MODES)}")
    if a.compile and any(a.vram) and not a.child:  # streaming under torch.compile is not measured
        p.error("--compile with --vram runs on the whole GPU only (--vram 0): emulated cards run eager peers")
    needs_own_process = [x for x in a.peers if x in PEER_COMFY_ARGS]
    if needs_own_process and not a.vram and not a.child:
        p.error(f"--peers: {needs_own_process} set ComfyUI options read at its import: use --vram (a process a run)")
    unknown = [x for x in a.peers if x not in PEERS]
    if unknown:
        p.error(f"--peers: unknown {unknown}; choices: {list(PEERS)}")
    if not a.comfyui:
        p.error("--comfyui (or COMFYUI_DIR) must name a ComfyUI tree")
    return a


def run(argv=None) -> dict:
    """The benchmark as ``python -m comfyui_ideogram4_int8.bench.comfy`` runs it (``argv``: its arguments): one
    ``--vram`` child's run, the ``--vram`` parent, or the in-process run; the result."""
    a = parse(argv)
    if a.child:
        return child.run(a)
    if a.vram:
        return parent.run(a)
    return inprocess.run(a)
