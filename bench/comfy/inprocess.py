"""The in-process run (no ``--vram``): every peer in this process, one after another, on one layout's files at a
time; per peer a 2-step warm-up, a timed ``--steps`` run and each ``--compile`` mode's compiled clones."""

from __future__ import annotations

import gc
import json
import pathlib
import time

import torch

from ..report import run_info
from ..timing import ClockWatch
from .comfyui import comfyui_version, import_comfyui
from .device import peak_gib, peaks_per_card, reset_peaks, sync
from .peers import (
    TEXT_TOKENS,
    WIDTH,
    compiled_clones,
    compiled_frames,
    config_for,
    each_layout,
    load_models,
    sample_with,
    write_layout,
)
from .report import peer_ratios, plot, print_peers


def run(a) -> dict:
    if not torch.cuda.is_available() and a.config == "full" and not (a.layers and a.size):
        raise SystemExit(
            "the ComfyUI end-to-end benchmark needs a CUDA GPU (CPU smoke runs: --config demo, or --layers and --size)"
        )
    import_comfyui(a.comfyui)
    import comfy.model_management

    from ... import kernels
    from ...kernels import launch, model_notes

    config = config_for(a)
    size = a.size or (WIDTH if a.config == "full" else 256)
    workdir = pathlib.Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    tokens = TEXT_TOKENS if a.config == "full" else 16
    ctx = torch.randn(1, tokens, config.llm_features_dim, generator=g).bfloat16()
    result = {
        "info": run_info(
            "comfy",
            comfyui=comfyui_version(a.comfyui),
            layers=config.num_layers,
            size=f"{size}x{size}",
            text_tokens=TEXT_TOKENS,
            steps=a.steps,
            sampler=a.sampler,
            backends=kernels.backends.report(),
            cached_launches=launch.status(),
        ),
        "peers": {},
    }
    reference = torch.load(a.reference_latent) if a.reference_latent else None
    for layout, peers, files in each_layout(a.peers, lambda layout: write_layout(layout, config, workdir, a.seed)):
        for peer in peers:
            entry = result["peers"][peer] = {"layout": layout}
            try:
                t0 = time.perf_counter()
                models, notes = load_models(peer, files, config)
                entry.update(load_s=round(time.perf_counter() - t0, 1), **notes)
                model_notes.forget()
                # warm-up: autotuning, first loads
                _, eager_warmup_ms = _sample(models, ctx, 2, a.seed, size, a.sampler)
                reset_peaks()
                with ClockWatch() as watch:
                    latent, ms = _sample(models, ctx, a.steps, a.seed, size, a.sampler)
                entry.update(
                    sm_mhz_median=watch.sm_mhz,
                    watts_median=watch.watts,
                    sample_ms=round(ms, 1),
                    step_ms=round(ms / a.steps, 1),
                    peak_gib=peak_gib(),
                    peak_gib_per_card=peaks_per_card(),
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
    peer_ratios(result)
    print_peers(result)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
        plot(result, pathlib.Path(a.out).with_suffix(".png"))
    return result


def _sample(models, ctx, steps: int, seed: int, size: int, sampler: str = "pack") -> tuple[torch.Tensor, float]:
    from ...ideogram4 import sampling_args

    plan = (
        sampling_args.plan_sampling("Default 20", size, size)
        if steps == 20
        else sampling_args.plan_sampling("custom", size, size, steps=steps, polish_steps=min(2, steps - 1))
    )
    sync()
    t0 = time.perf_counter()
    latent = sample_with(sampler, models, ctx, plan, size, seed)
    sync()
    return latent.float().cpu(), (time.perf_counter() - t0) * 1e3


def _run_compiled(result, peer, mode, models, ctx, a, size, reference, eager_warmup_ms) -> None:
    """``peer`` compiled in ``mode``: one more entry of ``result["peers"]`` (an error there, not raised)."""
    import comfy.model_management
    import torch._dynamo

    from ... import kernels
    from ...kernels import model_notes

    name = f"{peer} compiled:{mode}"
    entry = result["peers"][name] = {"layout": result["peers"][peer]["layout"], "compiled": mode}
    try:
        torch._dynamo.reset()
        comfy.model_management.unload_all_models()  # the eager MODELs leave the GPU before the compiled clones load
        compiled = compiled_clones(models, mode)
        model_notes.forget()
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
            peak_gib=peak_gib(),
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
