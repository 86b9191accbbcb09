"""``--vram``: the peers on the cards users own, each run in a process of its own.

    COMFYUI_DIR=... python -m comfyui_ideogram4_int8.bench.comfy --workdir /tmp/i4 --vram 0,24,16,12,8 \\
        --peers ours-w8a8,native-fp8 --steps 6 --out results.json

The parent writes each layout's synthetic files once (in a process of its own: it never holds GPU memory) and starts
one child process (``child.py``) per (peer, card size, compile mode), so no peer's allocator state, compiled kernels
or pinned memory reaches another; before the reported runs, a throw-away run of each way of loading fills the kernel
caches in ``--workdir`` (``--cold``: one more run first, with them empty). It adds per card size (``report.py``): the
ratio to the pack's resident run (size 0), the ratio to each native peer at the same size, and a floor:
max(resident step, bytes streamed per step / pinned bandwidth); per image the same against the warm images.

``--compile MODE`` (whole GPU only, ``--vram 0``): each peer also runs compiled in a process of its own, labelled
"<peer> compiled:MODE"; its ratios are to its own eager run (``speedup_vs_eager``) and to the native peers compiled
the same way.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import torch

from ..report import command
from .peers import PEERS, TEXT_ENCODER, VAE, WIDTH, config_for, each_layout, layout_files
from .report import COMPILED, cap_name, card_ratios, print_cards, print_images, print_passes


def run(a) -> dict:
    config = config_for(a)
    workdir = pathlib.Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    result = {
        "info": {
            "command": command("comfy"),
            "layers": config.num_layers,
            "size": f"{a.size or WIDTH}x{a.size or WIDTH}",
            "steps": a.steps,
            "setup": a.setup,
            "sampler": a.sampler,
            "vram_gib": a.vram,
            "images": a.images,
            "decode": a.decode,
        },
        "runs": {},
    }
    caches = workdir / "kernel-caches"  # every child's Triton and autotune caches: --cold starts them empty
    if a.cold:
        shutil.rmtree(caches, ignore_errors=True)
    warmed: set = set()
    if a.prompts:  # one file for every run, written first
        _spawn_write(a, TEXT_ENCODER)
    if a.decode:
        _spawn_write(a, VAE)
    # each layout written in a process of its own: the parent never holds GPU memory
    for _, peers, files in each_layout(a.peers, lambda layout: _spawn_write(a, layout), keep=a.reuse_files):
        pack = [p for p in peers if not PEERS[p][1].startswith("native")]
        if a.cold and pack and "cold" not in result["info"]:
            # the first-ever image: empty kernel caches, so autotuning and compilation happen in it
            c = _spawn(a, pack[0], a.vram[0], files, log_name="cold", images=1)
            result["info"]["cold"] = _first_image(c)
            warmed.add(PEERS[pack[0]][1])
        # a throw-away run of each pack peer, and of the first peer of all: its kernels autotuned and cached (the first
        # image of a reported run is a user's first after a load, not a first install), and no reported run is a
        # machine's first process (that one measured 303 ms per step where the same run measured 206 right after)
        # (one per way of loading: peers that load alike run the same kernels)
        first_of_each = {}
        for p in pack:
            first_of_each.setdefault(PEERS[p][1], p)
        todo = [p for how, p in first_of_each.items() if how not in warmed] or ([] if warmed else peers[:1])
        for peer in [] if a.no_warmup else todo:
            w = _spawn(a, peer, a.vram[0], files, log_name=f"warmup-{peer}", images=1, steps=2)
            result["info"].setdefault("warmups", {})[peer] = _first_image(w)
            warmed.add(PEERS[peer][1])
        for peer in peers:
            for cap in a.vram:
                for mode in [None, *a.compile]:
                    label = f"{peer}{COMPILED}{mode}" if mode else peer
                    name = f"{label}@{cap_name(cap)}"
                    entry = _spawn(a, peer, cap, files, compile_mode=mode)
                    result["runs"][name] = entry
                    for key in ("gpu", "torch", "triton", "comfyui", "pinned_gib_s", "pageable_gib_s"):
                        if key in entry and key not in result["info"]:
                            result["info"][key] = entry[key]
                    print(f"[{name}] {json.dumps(entry)[:900]}", flush=True)
                    if a.out:
                        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
    card_ratios(result)
    compare_latents(result, a.latents)
    print_cards(result)
    print_passes(result)
    print_images(result)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
    return result


def _first_image(entry: dict) -> dict:
    """What a one-image run reports: its peer, card, load and image seconds, its decode's (or its error)."""
    out = {k: entry[k] for k in ("peer", "vram_gib", "load_s", "error") if k in entry}
    if entry.get("images"):
        out["image_s"] = entry["images"][0]["seconds"]
        out["step_ms_median"] = entry["images"][0]["step_ms_median"]
        if "decode_s" in entry["images"][0]:
            out["decode_s"] = entry["images"][0]["decode_s"]
    return out


def _spawn_write(a, layout: str) -> dict:
    """{branch: file} of ``layout`` (or {"text_encoder": file} for ``TEXT_ENCODER``, {"vae": file} for ``VAE``),
    written by a child process unless ``--reuse-files`` finds them."""
    files = layout_files(layout, pathlib.Path(a.workdir))
    if a.reuse_files and all(f.exists() for f in files.values()):
        print(f"[{layout}] using the files already in {a.workdir}", flush=True)
        return files
    entry = _spawn(a, None, 0, {}, write=layout)
    if "files" not in entry:
        raise RuntimeError(f"writing the {layout} files failed: {entry.get('error')}")
    # the kernel writes the ~20 GB back to disk after the writer exits; measured runs during that writeback were slow
    # (H100: the first runs after each layout's files 263-337 ms where the same runs gave 207-273 later)
    os.sync()
    return {b: pathlib.Path(p) for b, p in entry["files"].items()}


def _spawn(
    a,
    peer: str | None,
    cap: float,
    files: dict,
    write: str | None = None,
    log_name: str = "",
    compile_mode: str | None = None,
    images: int | None = None,
    steps: int | None = None,
) -> dict:
    job = {"peer": peer, "cap": cap, "files": {b: str(p) for b, p in files.items()}, "write": write}
    job["compile"] = compile_mode
    if a.prompts and peer is not None:
        job["text_encoder"] = str(layout_files(TEXT_ENCODER, pathlib.Path(a.workdir))["text_encoder"])
    if a.decode and peer is not None:
        job["vae"] = str(layout_files(VAE, pathlib.Path(a.workdir))["vae"])
    cmd = [
        sys.executable,
        "-m",
        "comfyui_ideogram4_int8.bench.comfy",
        "--workdir",
        a.workdir,
        "--comfyui",
        a.comfyui,
        "--config",
        a.config,
        "--steps",
        str(steps or a.steps),
        "--images",
        str(images or a.images),
        "--seed",
        str(a.seed),
        "--setup",
        a.setup,
        "--sampler",
        a.sampler,
        "--child",
        json.dumps(job),
    ]
    if a.layers:
        cmd += ["--layers", str(a.layers)]
    if a.size:
        cmd += ["--size", str(a.size)]
    if a.latents:
        cmd += ["--latents", a.latents]
    if a.kernels:
        cmd += ["--kernels", "--kernel-steps", str(a.kernel_steps)]
    if a.host_profile:
        cmd += ["--host-profile"]
    if a.profile_first:
        cmd += ["--profile-first"]
    if a.profile_warm:
        cmd += ["--profile-warm"]
    caches = pathlib.Path(a.workdir) / "kernel-caches"
    env = dict(os.environ, TRITON_CACHE_DIR=str(caches / "triton"), IDEOGRAM4_INT8_CACHE_DIR=str(caches / "pack"))
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CHILD_RESULT ")]
    if not lines:
        tail = (out.stdout[-1500:] + "\n" + out.stderr[-2500:]).strip()
        return {"error": f"exit {out.returncode}: {tail}"[-3000:], "process_s": round(time.perf_counter() - t0, 1)}
    entry = json.loads(lines[-1][len("CHILD_RESULT ") :])
    entry["process_s"] = round(time.perf_counter() - t0, 1)
    if peer:  # ComfyUI's and the pack's log of the run (loading decisions), next to the results
        logs = pathlib.Path(a.workdir) / "logs"
        logs.mkdir(exist_ok=True)
        # file names of letters, digits, '.', '_' and '-' only: the device tool brings no other back
        mode = f"_compiled-{compile_mode}" if compile_mode else ""
        (logs / f"{log_name or peer + mode + '_' + cap_name(cap)}.log").write_text(out.stderr[-200000:])
    return entry


def compare_latents(result: dict, folder: str | None) -> None:
    """Each run's latent against its own peer's resident run (streaming must not change the result)."""
    if not folder:
        return
    for name, e in result["runs"].items():
        peer, cap = name.split("@")
        ref, got = pathlib.Path(folder) / f"{peer}@resident.pt", pathlib.Path(folder) / f"{name}.pt"
        if cap == "resident" or not ref.exists() or not got.exists():
            continue
        x, y = torch.load(got).double().flatten(), torch.load(ref).double().flatten()
        e["latent_max_abs_vs_resident"] = (x - y).abs().max().item()
        e["latent_cosine_vs_resident"] = round(torch.nn.functional.cosine_similarity(x, y, dim=0).item(), 7)
