"""GPU memory of Ideogram 4 with both INT8 branches sampling at 1024x1024 (target: peak <= 22 GiB, a 24 GB card).

Builds the conditional and unconditional branches at full size (9.3B-parameter DiT each) from synthetic weights,
through the node pack's own path: the in-memory W8A8 form (what ``read_branch`` returns for the transformerlab
file) -> ``nodes.runtime.native_model.build_native_model`` (ComfyUI's native Ideogram 4 model + the pack's fused-INT8
ops, on the CPU as the loader does) -> the ``Ideogram 4 Sampler`` node's sampling function (ComfyUI's guider,
KSAMPLER euler and model management, which load both models onto the GPU). Then it samples a few steps with a
text of ``--tokens`` tokens and prints ``torch.cuda.max_memory_allocated`` over the run.

    COMFYUI_DIR=/path/to/ComfyUI python -m comfyui_ideogram4_int8.bench.probes.comfy_memory [--steps 2] [--out x.json]

ComfyUI is imported in-process from ``--comfyui`` / ``$COMFYUI_DIR`` (its tree; comfy-kitchen and comfy-aimdo
importable). Without it (or with ``--reference``) the same weights run through the pack's reference DiT with
the same W8A8 modules and ``ideogram4.sample`` instead, and the output says so. ``--file PATH`` reads a
two-branch W8A8 file with the loader's ``read_branch`` instead of building the weights in memory (the file is
written first if missing: ~20 GB). ``--emulate-vram-gib 24`` makes ComfyUI's model management believe the
card has that much memory (``--reserve-vram``), to see whether it still loads both branches fully.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import torch

from ..comfy.cli import comfy_parser
from ..comfy.device import GIB


def _parse(argv):
    p = comfy_parser("probes.comfy_memory", __doc__)
    p.add_argument("--reference", action="store_true", help="measure with the reference DiT, not ComfyUI")
    p.add_argument("--file", default=None, help="two-branch W8A8 file to read (written first if missing)")
    p.add_argument("--config", default="full", choices=("full", "demo", "tiny"), help="architecture (full)")
    p.add_argument("--size", type=int, default=1024, help="width = height in pixels (1024)")
    p.add_argument("--tokens", type=int, default=512, help="text tokens of the conditional branch (512)")
    p.add_argument("--steps", type=int, default=2, help="sampling steps (2)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run; no memory numbers)")
    p.add_argument("--emulate-vram-gib", type=float, default=None, help="let ComfyUI see only this much VRAM")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the result as JSON here")
    return p.parse_args(argv)


def _import_comfyui(root: str, device: str, emulate_gib: float | None):
    """Import ComfyUI in-process (no server) with its command-line defaults."""
    root = str(pathlib.Path(root).resolve())
    sys.path.insert(0, root)
    argv, sys.argv = sys.argv, [sys.argv[0]] + (["--cpu"] if device == "cpu" else [])
    try:
        from comfy.cli_args import args

        if device == "cpu":
            args.cpu = True
        if emulate_gib is not None and torch.cuda.is_available():
            total = torch.cuda.get_device_properties(0).total_memory / GIB
            args.reserve_vram = max(0.0, total - emulate_gib)
        import comfy.model_management  # noqa: F401  (sets up devices)

        from ...nodes import sampler_nodes  # noqa: F401  (ComfyUI's node API must import too)
        from ...nodes.runtime import native_model  # noqa: F401
    finally:
        sys.argv = argv


def _branch_states(a, config, device):
    """Both branches in the in-memory W8A8 form, on the CPU (as the loader holds them before ComfyUI loads)."""
    from ...ideogram4 import read_branch, synthetic

    gen_device = device if device == "cuda" else "cpu"
    if a.file:
        path = pathlib.Path(a.file)
        if not path.exists():
            t = time.perf_counter()
            ws = {
                b: synthetic.RandomWeights(config, a.seed + i, device=gen_device)
                for i, b in enumerate(("conditional", "unconditional"))
            }
            synthetic.write_w8a8(path, ws, config)
            print(f"wrote {path} ({path.stat().st_size / GIB:.1f} GiB) in {time.perf_counter() - t:.0f}s", flush=True)
        return {b: read_branch(path, b, device="cpu") for b in ("conditional", "unconditional")}
    out = {}
    for i, b in enumerate(("conditional", "unconditional")):
        ws = synthetic.RandomWeights(config, a.seed + i, device=gen_device)
        out[b] = synthetic.w8a8_state(ws, config, branch=b, device="cpu")
    return out


def _state_bytes(state) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def run(argv=None) -> dict:
    a = _parse(argv)
    from ...ideogram4 import make_noise, sample, sampling_args
    from ...ideogram4.config import Ideogram4Config

    config = getattr(Ideogram4Config, a.config)()
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: pass --device cpu for a smoke run")
    mode = "reference"
    why = "--reference given" if a.reference else ""
    if not a.reference:
        if not a.comfyui:
            why = "no ComfyUI tree (--comfyui / COMFYUI_DIR)"
        else:
            try:
                _import_comfyui(a.comfyui, a.device, a.emulate_vram_gib)
                mode = "comfyui"
            except Exception as exc:  # noqa: BLE001 - report and fall back, labelled
                why = f"importing ComfyUI failed: {type(exc).__name__}: {exc}"
    print(f"mode: {mode}" + (f" ({why})" if why else ""), flush=True)

    t0 = time.perf_counter()
    states = _branch_states(a, config, a.device)
    weight_bytes = {b: _state_bytes(s) for b, s in states.items()}
    print(
        f"built both branches in {time.perf_counter() - t0:.0f}s: "
        + ", ".join(f"{b} {n / GIB:.2f} GiB" for b, n in weight_bytes.items()),
        flush=True,
    )
    plan = sampling_args.plan_sampling("custom", a.size, a.size, steps=a.steps, polish_steps=min(1, a.steps - 1))
    g = torch.Generator().manual_seed(a.seed)
    ctx = torch.randn(1, a.tokens, config.llm_features_dim, generator=g)

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    extra = {}
    if mode == "comfyui":
        import comfy.model_management

        from ...nodes import sampler_nodes
        from ...nodes.runtime.native_model import build_native_model

        dtype = torch.bfloat16 if cuda else torch.float32
        models = {}
        for b in ("conditional", "unconditional"):
            models[b], _ = build_native_model(states[b], config, label=b, compute_dtype=dtype)
            states[b].clear()
        latent = sampler_nodes.sample(
            models["conditional"], models["unconditional"], [[ctx, {}]], plan, a.size, a.size, a.seed
        )
        for b, m in models.items():
            extra[f"{b}_loaded_gib"] = m.model.model_loaded_weight_memory / GIB
            extra[f"{b}_lowvram"] = bool(getattr(m.model, "model_lowvram", False))
        extra["comfy_device"] = str(comfy.model_management.get_torch_device())
    else:
        from ...ideogram4.dit import Ideogram4DiT
        from ...ideogram4.w8a8_module import w8a8_linears

        dev = torch.device(a.device)
        dtype = torch.bfloat16 if cuda else torch.float32
        models = {}
        for b in ("conditional", "unconditional"):
            st = states[b]
            for k in list(st):
                st[k] = st[k].to(dev)
            models[b] = Ideogram4DiT.from_state_dict(
                st, w8a8_linears(), config=config, dtype=dtype, label=b, consume=True
            )
        with torch.no_grad():
            latent = sample(
                models["conditional"],
                models["unconditional"],
                ctx.to(dev, dtype),
                width=a.size,
                height=a.size,
                sigmas=plan.sigmas,
                guidance=plan.guidance,
                noise=make_noise(a.seed, a.size, a.size, 1, config.in_channels),
                device=dev,
            )
    if cuda:
        torch.cuda.synchronize()
    from ... import kernels

    result = {
        "mode": mode,
        "why_not_comfyui": why or None,
        "config": a.config,
        "size": a.size,
        "tokens": a.tokens,
        "steps": a.steps,
        "weights_gib": {b: round(n / GIB, 3) for b, n in weight_bytes.items()},
        "sample_seconds": round(time.perf_counter() - t1, 1),
        "latent_finite": bool(torch.isfinite(latent).all()),
        "paths": {m: kernels.REGISTRY.counts(m) for m in ("conditional", "unconditional")},
        "peak_gib": round(torch.cuda.max_memory_allocated() / GIB, 3) if cuda else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3) if cuda else None,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "target_gib": 22.0,
        **extra,
    }
    if cuda:
        result["fits_target"] = result["peak_gib"] <= 22.0
    print(json.dumps(result, indent=2), flush=True)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    run()
