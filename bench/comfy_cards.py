"""``comfy_e2e --vram``: the peers on the cards users own, each run in a process of its own.

    COMFYUI_DIR=... python -m comfyui_ideogram4_int8.bench.comfy_e2e --workdir /tmp/i4 --vram 0,24,16,12,8 \\
        --peers ours-w8a8,native-fp8 --steps 6 --out results.json

The parent writes each layout's synthetic files once and starts one child process per (peer, card size), so no
peer's allocator state, compiled kernels or pinned memory reaches another. A child:

* sets ComfyUI's model management up as its server does (``--setup server``): comfy-aimdo's DynamicVRAM where it
  initializes on this machine (``control.init`` before ComfyUI's model management is imported, ``init_devices``
  after, the server's per-node clean-up between loading and sampling) and async offload; the result says whether
  DynamicVRAM came up and why not;
* emulates a card of ``--vram`` GiB with a hard cap: right after CUDA starts it takes everything above the card's
  size (its own CUDA context counted in) as one allocation, so ComfyUI's loading decisions read that card's free
  memory and nothing in the process can allocate past it;
* loads both branches, warms up 2 steps, samples ``--steps`` steps, and reports min / median of the per-step times
  (an event recorded at each step's callback, no synchronization, as in a server run without previews), the peak
  device memory (context included), the bytes the pack streamed per step, its copy time and whether the copies were
  hidden, and the pinned host→device bandwidth.

The parent adds per card size: the ratio to the pack's resident run (size 0), the ratio to each native peer at the
same size, and a floor: max(resident step, bytes streamed per step / pinned bandwidth).

``--compile MODE`` (whole GPU only, ``--vram 0``): each peer also runs compiled in a process of its own, its MODELs
compiled as ComfyUI's TorchCompileModel compiles them (``comfy_e2e._compiled``) before the warm-up (which then
traces, generates code and autotunes: ``warmup_s``), labelled "<peer> compiled:MODE"; its ratios are to its own
eager run (``speedup_vs_eager``) and to the native peers compiled the same way.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import torch

from .timing import ClockWatch

GIB = 1024**3
COMPILED = " compiled:"  # "<peer> compiled:<mode>": a run of the peer's MODELs under TorchCompileModel
NATIVE = ("native-bf16", "native-fp8", "native-fp8-fast", "native-int8-convrot")


# -- parent ------------------------------------------------------------------------------------------------------------
def parent(a) -> dict:
    from . import comfy_e2e as e2e

    config = e2e.config_for(a)
    workdir = pathlib.Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    result = {
        "info": {
            "command": "python -m comfyui_ideogram4_int8.bench.comfy_e2e " + " ".join(sys.argv[1:]),
            "layers": config.num_layers,
            "size": f"{a.size or e2e.WIDTH}x{a.size or e2e.WIDTH}",
            "steps": a.steps,
            "setup": a.setup,
            "sampler": a.sampler,
            "vram_gib": a.vram,
            "images": a.images,
        },
        "runs": {},
    }
    caches = workdir / "kernel-caches"  # every child's Triton and autotune caches: --cold starts them empty
    if a.cold:
        shutil.rmtree(caches, ignore_errors=True)
    warmed: set = set()
    # each layout written in a process of its own: the parent never holds GPU memory
    for _, peers, files in e2e.each_layout(a.peers, lambda layout: _spawn_write(a, layout), keep=a.reuse_files):
        pack = [p for p in peers if not e2e.PEERS[p][1].startswith("native")]
        if a.cold and pack and "cold" not in result["info"]:
            # the first-ever image: empty kernel caches, so autotuning and compilation happen in it
            c = _spawn(a, pack[0], a.vram[0], files, log_name="cold", images=1)
            result["info"]["cold"] = _first_image(c)
            warmed.add(e2e.PEERS[pack[0]][1])
        # a throw-away run of each pack peer, and of the first peer of all: its kernels autotuned and cached (the first
        # image of a reported run is a user's first after a load, not a first install), and no reported run is a
        # machine's first process (that one measured 303 ms per step where the same run measured 206 right after)
        # (one per way of loading: peers that load alike run the same kernels)
        todo = list({e2e.PEERS[p][1]: p for p in reversed(pack) if e2e.PEERS[p][1] not in warmed}.values())[::-1]
        todo = todo or ([] if warmed else peers[:1])
        for peer in [] if a.no_warmup else todo:
            w = _spawn(a, peer, a.vram[0], files, log_name=f"warmup-{peer}", images=1, steps=2)
            result["info"].setdefault("warmups", {})[peer] = _first_image(w)
            warmed.add(e2e.PEERS[peer][1])
        for peer in peers:
            for cap in a.vram:
                for mode in [None, *a.compile]:
                    label = f"{peer}{COMPILED}{mode}" if mode else peer
                    name = f"{label}@{_cap_name(cap)}"
                    entry = _spawn(a, peer, cap, files, compile_mode=mode)
                    result["runs"][name] = entry
                    for key in ("gpu", "torch", "triton", "comfyui", "pinned_gib_s", "pageable_gib_s"):
                        if key in entry and key not in result["info"]:
                            result["info"][key] = entry[key]
                    print(f"[{name}] {json.dumps(entry)[:900]}", flush=True)
                    if a.out:
                        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
    ratios(result)
    compare_latents(result, a.latents)
    print_table(result)
    print_passes(result)
    print_images(result)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
    return result


def _first_image(entry: dict) -> dict:
    """What a one-image run reports: its peer, card, load and image seconds (or its error)."""
    out = {k: entry[k] for k in ("peer", "vram_gib", "load_s", "error") if k in entry}
    if entry.get("images"):
        out["image_s"] = entry["images"][0]["seconds"]
        out["step_ms_median"] = entry["images"][0]["step_ms_median"]
    return out


def _cap_name(cap: float) -> str:
    return "resident" if not cap else f"{cap:g}GB"


def _spawn_write(a, layout: str) -> dict:
    from . import comfy_e2e as e2e

    files = e2e.layout_files(layout, pathlib.Path(a.workdir))
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
    cmd = [
        sys.executable,
        "-m",
        "comfyui_ideogram4_int8.bench.comfy_e2e",
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
        (logs / f"{log_name or peer + mode + '_' + _cap_name(cap)}.log").write_text(out.stderr[-200000:])
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


def ratios(result: dict) -> None:
    runs = result["runs"]
    for name, e in runs.items():
        if "step_ms_median" not in e:
            continue
        peer, cap = name.split("@")
        base, _, mode = peer.partition(COMPILED)
        suffix = f"{COMPILED}{mode}" if mode else ""  # a compiled run against natives compiled the same way
        if mode and runs.get(f"{base}@{cap}", {}).get("step_ms_median"):
            e["speedup_vs_eager"] = round(runs[f"{base}@{cap}"]["step_ms_median"] / e["step_ms_median"], 3)
            e["eager_sm_mhz"] = runs[f"{base}@{cap}"].get("sm_mhz_median")
        own = runs.get(f"{peer}@resident", {}).get("step_ms_median")
        ours = runs.get("ours-w8a8@resident", {}).get("step_ms_median")
        if own:
            e["x_own_resident"] = round(e["step_ms_median"] / own, 3)
        if ours and peer.startswith("ours"):
            e["x_ours_resident"] = round(e["step_ms_median"] / ours, 3)
            streamed = e.get("gib_streamed_per_step") or 0
            bw = e.get("pinned_gib_s")
            e["floor_ms"] = round(max(ours, streamed / bw * 1e3 if bw else 0), 1)
        for ref in NATIVE:
            other = runs.get(f"{ref}{suffix}@{cap}", {}).get("step_ms_median")
            if other:
                e[f"speedup_vs_{ref}"] = round(other / e["step_ms_median"], 3)
        image_ratios(e, runs, peer, cap, suffix)


def image_ratios(e: dict, runs: dict, peer: str, cap: str, suffix: str) -> None:
    """Per image: the floor (steps x the larger of the peer's resident step and the bytes it streamed per step over
    the pinned bandwidth), the warm image against it, and the ratio to each native peer's warm image on that card."""
    if not e.get("images"):
        return
    steps = e["images"][-1]["steps"]
    resident = runs.get(f"{peer}@resident", {}).get("step_ms_median") or e["step_ms_median"]
    bw = e.get("pinned_gib_s")
    streamed = (e.get("gib_streamed_per_step") or 0) / bw * 1e3 if bw else 0
    e["image_s_floor"] = round(steps * max(resident, streamed) / 1e3, 3)
    warm = e.get("image_s_warm_median")
    if not warm:
        return
    e["image_x_floor"] = round(warm / e["image_s_floor"], 3)
    e["image_x_steps"] = round(warm / (steps * e["step_ms_median"] / 1e3), 3)  # what the step median does not show
    for ref in NATIVE:
        other = runs.get(f"{ref}{suffix}@{cap}", {}).get("image_s_warm_median")
        if other:
            e[f"image_speedup_vs_{ref}"] = round(other / warm, 3)


def print_table(result: dict) -> None:
    from .comfy_e2e import print_runs, two_places

    info = result["info"]

    def row(e):
        r = functools.partial(two_places, e)
        hidden = {True: "yes", False: "no", None: "-"}[e.get("copies_hidden")]
        return (
            f"{e['step_ms_min']:>8.1f}{e['step_ms_median']:>8.1f}{r('x_ours_resident'):>7}"
            f"{r('speedup_vs_native-fp8'):>7}{r('speedup_vs_native-bf16'):>7}{r('speedup_vs_native-int8-convrot'):>7}"
            f"{e.get('floor_ms', '-'):>7}{e.get('gib_streamed_per_step', 0):>7.2f}"
            f"{e.get('copy_ms_per_step', 0):>7.1f}{hidden:>5}{e['peak_gib']:>7.2f}  "
            f"{e.get('dynamic_vram', '-')[:40]}"
        )

    print_runs(
        f"{info.get('gpu', '?')}, torch {info.get('torch', '?')}, triton {info.get('triton', '?')}, ComfyUI "
        f"{info.get('comfyui', '?')}, {info['size']}, {info['steps']} steps, setup {info['setup']}, sampler "
        f"{info.get('sampler', 'pack')}, pinned H2D {info.get('pinned_gib_s', '?')} GiB/s",
        ("run", 34),
        f"{'min ms':>8}{'med ms':>8}{'x res':>7}{'x fp8':>7}{'x bf16':>7}{'x int8':>7}{'floor':>7}"
        f"{'GiB/st':>7}{'copy':>7}{'hid':>5}{'peak':>7}  dynvram",
        result["runs"],
        row,
        failed=slice(-160, None),  # the end of a child's traceback says what failed
    )


def print_images(result: dict) -> None:
    """Seconds per image: the first after the load and the warm ones (median), against the floor and the natives."""
    from .comfy_e2e import print_runs, two_places

    def row(e):
        r = functools.partial(two_places, e)
        equal = {True: "yes", False: "NO", None: "-"}[e.get("latent_equal_first")]
        counts = e["images"][-1] if e.get("images") else {}
        return (
            f"{e.get('image_s_first', 0):>8.2f}{e.get('image_s_warm_median', 0):>8.2f}{e.get('image_s_floor', 0):>8.2f}"
            f"{r('image_x_floor'):>8}{r('image_x_steps'):>8}{r('image_speedup_vs_native-fp8'):>7}"
            f"{r('image_speedup_vs_native-bf16'):>7}{e.get('step_ms_median', 0):>8.1f}{equal:>6}"
            f"{counts.get('graph_captures', 0):>5}{counts.get('plan_changes', 0):>5}"
        )

    runs = {k: e for k, e in result["runs"].items() if "error" in e or e.get("images")}
    if not runs:
        return
    info = result["info"]
    print_runs(
        f"seconds per image ({info['steps']} steps, {info.get('images', '?')} images per run after the load; warm: "
        "the median of runs 2..N; floor: steps x max(resident step, streamed bytes / pinned bandwidth))",
        ("run", 34),
        f"{'first':>8}{'warm':>8}{'floor':>8}{'x floor':>8}{'x steps':>8}{'x fp8':>7}{'x bf16':>7}{'step ms':>8}"
        f"{'same':>6}{'capt':>5}{'plan':>5}",
        runs,
        row,
        failed=slice(-160, None),
    )
    for key in ("cold", "warmups"):
        if info.get(key):
            print(f"{key}: {json.dumps(info[key])}")


def print_passes(result: dict) -> None:
    """Per run and branch: the median host and GPU time of one pass (``_PassTimer``)."""
    for name, e in result["runs"].items():
        parts = [
            f"{label} host {t['host_ms_median']} / GPU {t['gpu_ms_median']} ms"
            for label, t in (e.get("pass_ms") or {}).items()
            if t
        ]
        if parts:
            print(f"{name:<34} per pass: " + "; ".join(parts))
        for label, note in (e.get("graph_notes") or {}).items():
            print(f"{name:<34} {label}: {note[:110]}")
        if e.get("compiled"):
            fc = e.get("frames_compiled")
            print(
                f"{name:<34} compiled {e['compiled']}: {e.get('speedup_vs_eager', '-')}x its eager run, warm-up "
                f"{e.get('warmup_s', '-')} s, SM {e.get('sm_mhz_median')} MHz ({e.get('watts_median')} W) "
                f"against {e.get('eager_sm_mhz', '-')}"
                + (f"; frames compiled in the timed steps: {fc['timed_steps']}" if fc else "")
            )
        if e.get("profile"):  # --kernels: which steps the per-step numbers cover, and the run's once-per-run work
            print(f"{name:<34} {_per_run_line(e)}")
        b = e.get("bus")
        if b:  # --kernels: the profiled steps as a timeline (bench/kernel_table.py ``bus``)
            where = ", ".join(f"{k[:40]} {v}" for k, v in list(b["idle_at"].items())[:3])
            print(
                f"{name:<34} bus busy {b['bus_busy_ms']} / idle {b['bus_idle_ms']} of {b['span_ms']} ms; "
                f"compute {b['compute_busy_ms']}; neither {b['both_idle_ms']}; idle at: {where}"
            )
            blocked = ", ".join(f"{k} {v}" for k, v in list(b.get("host_blocked_ms", {}).items())[:4])
            if blocked:
                print(f"{name:<34} host blocked per step (calls >= 0.2 ms): {blocked}")
        for key in ("cumulative", "self"):
            rows = list((e.get("host_profile") or {}).get(key, {}).items())[:12]
            if rows:
                print(f"{name:<34} host {key} ms/step: " + "; ".join(f"{k[-60:]} {v[0]}" for k, v in rows))
        alloc = e.get("allocator")
        if alloc and any(alloc.values()):
            print(f"{name:<34} allocator in the timed steps: " + ", ".join(f"{k} {v}" for k, v in alloc.items()))


def _per_run_line(e: dict) -> str:
    from .kernel_table import coverage

    r = e.get("per_run") or {}
    rows = ", ".join(f"{k[:40]} {v['count']:+g} {v['ms']:+.2f}" for k, v in list(r.get("kernels", {}).items())[:3])
    line = (
        f"kernels and bus per step: {coverage(e['profile'])}; per run beyond: launches {r.get('launches_ms')} ms "
        f"({rows or 'none'}), the same kernels {r.get('timing_ms')} ms"
    )
    b = r.get("bus")
    if b:
        gap = f", its largest bus gap {b['gaps'][0][0]} ms ({b['gaps'][0][3] or b['gaps'][0][2]})" if b["gaps"] else ""
        line += f"; span {b['span_ms']:+} ms, neither busy {b['both_idle_ms']:+} ms{gap}"
    return line


# -- child -------------------------------------------------------------------------------------------------------------
def child(a) -> dict:
    job = json.loads(a.child)
    if job.get("write"):
        return _child_write(a, job["write"])
    peer, cap = job["peer"], float(job["cap"])
    entry: dict = {"peer": peer, "vram_gib": cap}
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("comfyui_ideogram4_int8").setLevel(logging.DEBUG)
    try:
        entry.update(_bandwidth())
        entry["dynamic_vram"] = _setup_comfyui(a.comfyui, server=a.setup == "server")
        ballast = _take_all_but(cap)  # held for the whole run: the emulated card's edge
        extra = ballast.numel() if ballast is not None else 0
        entry["ballast_gib"] = round(extra / GIB, 2)
        files = {b: pathlib.Path(p) for b, p in job["files"].items()}
        entry.update(_run_peer(a, peer, files, extra, job.get("compile")))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which keeps the other runs
        import traceback

        entry["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
    print("CHILD_RESULT " + json.dumps(entry), flush=True)
    return entry


def _child_write(a, layout: str) -> dict:
    from . import comfy_e2e as e2e

    config = e2e.config_for(a)
    entry = {}
    try:
        files = e2e._write_layout(layout, config, pathlib.Path(a.workdir), a.seed)
        entry["files"] = {b: str(p) for b, p in files.items()}
    except Exception as exc:  # noqa: BLE001
        entry["error"] = f"{type(exc).__name__}: {exc}"
    print("CHILD_RESULT " + json.dumps(entry), flush=True)
    return entry


def _bandwidth() -> dict:
    """Host→device GiB/s from pinned and pageable memory (1 GiB, 4 copies each), before anything else runs."""
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    out["triton"] = triton.__version__
    for pinned in (True, False):
        h = torch.empty(GIB, dtype=torch.uint8, pin_memory=pinned)
        d = torch.empty_like(h, device="cuda")
        d.copy_(h)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(4):
            d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        out["pinned_gib_s" if pinned else "pageable_gib_s"] = round(4 / (time.perf_counter() - t), 1)
        del h, d
    torch.cuda.empty_cache()
    return out


def _setup_comfyui(root: str, server: bool) -> str:
    """Import ComfyUI as its server does; returns what DynamicVRAM did ("enabled", or why not)."""
    root = str(pathlib.Path(root).resolve())
    sys.path.insert(0, root)
    argv, sys.argv = sys.argv, [sys.argv[0]]
    try:
        from comfy.cli_args import args, enables_dynamic_vram

        state = "off (--setup plain)"
        control = None
        if server and enables_dynamic_vram():
            try:
                import comfy_aimdo.control as control

                try:
                    control.init(simple_vram_headroom=None, nvml_pressure=True)
                except TypeError:
                    control.init()
            except Exception as exc:  # noqa: BLE001
                state, control = f"comfy-aimdo did not load: {type(exc).__name__}: {exc}"[:200], None
        import comfy.memory_management
        import comfy.model_management as mm
        import comfy.model_patcher

        if server and control is not None:
            if mm.torch_version_numeric < (2, 8):
                state = "off: torch < 2.8"
            else:
                try:
                    devices = mm.get_all_torch_devices()
                    ok = control.init_devices((d.index, int(args.vram_headroom * GIB)) for d in devices)
                except TypeError:
                    ok = control.init_devices(d.index for d in mm.get_all_torch_devices())
                if ok:
                    comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
                    comfy.memory_management.aimdo_enabled = True
                    state = "enabled"
                else:
                    state = "off: comfy_aimdo.control.init_devices returned False (as the server would fall back)"
        state += f"; async offload streams {mm.NUM_STREAMS}"
        return state
    finally:
        sys.argv = argv


def _take_all_but(cap: float):
    """Hold everything above a ``cap``-GiB card (this process's CUDA context counted in) as one allocation."""
    if not cap:
        return None
    free, total = torch.cuda.mem_get_info()
    context = total - free  # this process's context (and whatever else holds the GPU now)
    extra = int(free - (cap * GIB - context))
    if extra <= 0:
        raise RuntimeError(f"the GPU has {free / GIB:.1f} GiB free: cannot emulate a {cap:g} GiB card")
    return torch.empty(extra, dtype=torch.uint8, device="cuda")


def _server_cleanup() -> None:
    """What ComfyUI's executor does after each node when DynamicVRAM is on (execution.py)."""
    import comfy.memory_management
    import comfy.model_management

    if comfy.memory_management.aimdo_enabled:
        import comfy_aimdo.model_vbar

        comfy.model_management.reset_cast_buffers()
        comfy_aimdo.model_vbar.vbars_reset_watermark_limits()


class _PassTimer:
    """``APPLY_MODEL`` wrapper: per pass, the host time of the model call (kernel launches and Python; a wait inside
    it counts too) and the GPU time between events on the pass's own device. Host time close to GPU time means the
    pass is bound by its launches (two passes on two cards then take turns on one interpreter). Added after a
    compile wrapper (``comfy_e2e._compiled``), it runs inside it but outside the compiled diffusion model: dynamo
    never traces its clock or events (which would break the graph, and under CUDA-graph backends record events in
    a capture)."""

    def __init__(self) -> None:
        self.on = False
        self.rows: list = []

    def __call__(self, executor, *args, **kwargs):
        x = args[0] if args else None
        if not self.on or not isinstance(x, torch.Tensor) or x.device.type != "cuda":
            return executor(*args, **kwargs)
        stream = torch.cuda.current_stream(x.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        t0 = time.perf_counter()
        out = executor(*args, **kwargs)
        host_ms = (time.perf_counter() - t0) * 1e3
        end.record(stream)
        self.rows.append((host_ms, start, end))
        return out

    def summary(self) -> dict:
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
        if not self.rows:
            return {}
        host = [h for h, _, _ in self.rows]
        gpu = [s.elapsed_time(e) for _, s, e in self.rows]
        return {
            "passes": len(self.rows),
            "host_ms_median": round(statistics.median(host), 1),
            "gpu_ms_median": round(statistics.median(gpu), 1),
        }


def host_profile(run, steps: int, top: int = 80) -> dict:
    """The Python functions of ``run()`` by host time (cProfile), per step: ``self`` (time in the function itself)
    and ``cumulative`` (with its callees), the ``top`` of each as "file:line(function)" (file name only) -> ms."""
    import cProfile
    import os
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        run()
    finally:
        prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, function) -> (calls, primitive calls, self s, cumulative s, ..)

    def rows(index: int) -> dict:
        best = sorted(stats.items(), key=lambda kv: -kv[1][index])[:top]
        return {
            f"{os.path.basename(f)}:{line}({fn})": [round(v[index] * 1e3 / steps, 2), round(v[0] / steps, 1)]
            for (f, line, fn), v in best
        }

    return {"self": rows(2), "cumulative": rows(3), "unit": "[ms per step, calls per step]"}


def _profiled_run(sample, step_hooks: list, steps: int, count: int, activities=None) -> dict:
    """A run of ``steps`` steps with ``count`` from its middle profiled (``step_profile``; ``activities``: the
    profiler's, CUDA by default): ``kernels`` and ``bus`` (where a streaming step's bus sat idle) per profiled step,
    ``profile`` (which steps), ``per_run`` (what the run had beyond its steps: the conditioning's copy, the set-up)."""
    from torch.profiler import ProfilerActivity

    from .step_profile import StepProfile, middle_steps

    prof = StepProfile(middle_steps(steps, count), activities or [ProfilerActivity.CUDA])
    step_hooks.append(prof.step_done)
    try:
        with prof:
            sample(steps)
    finally:
        step_hooks.remove(prof.step_done)
    return prof.report()


ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


def _run_peer(a, peer: str, files: dict, ballast_bytes: int, compile_mode: str | None = None) -> dict:
    import latent_preview

    from .. import kernels
    from ..ideogram4 import sampling_args
    from ..nodes import cuda_graphs, sampler_nodes, streaming_patcher
    from . import comfy_e2e as e2e

    config = e2e.config_for(a)
    size = a.size or e2e.WIDTH
    g = torch.Generator().manual_seed(1234)
    ctx = torch.randn(1, e2e.TEXT_TOKENS, config.llm_features_dim, generator=g).bfloat16()
    out = {"comfyui": e2e._comfyui_version(a.comfyui)}
    t0 = time.perf_counter()
    models, notes = e2e._load(peer, files, config)
    out["load_s"] = round(time.perf_counter() - t0, 1)
    out.update(notes)
    if compile_mode:  # as TorchCompileModel on both MODELs; the warm-up below compiles
        models = e2e._compiled(models, compile_mode)
        out["compiled"] = compile_mode
    _server_cleanup()
    marks: list = []
    peak = [0]
    step_hooks: list = []  # more to do at each step's end (the profiled run's cuts): none in the timed steps

    def timing_callback(*_args, **_kw):
        # an event per finished step, no synchronize: a sampler without previews never makes the host wait for the
        # card, so the host queues the next step while the GPU runs this one (a sync here would time a run users
        # do not have, with the host's per-step set-up exposed)
        def cb(step, x0, x, total_steps):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append(ev)
            f, t = torch.cuda.mem_get_info()  # reserved memory only grows within a run: a late reading still sees it
            peak[0] = max(peak[0], t - f)
            for hook in step_hooks:
                hook(step)

        return cb

    latent_preview.prepare_callback = timing_callback
    sampler_nodes.latent_preview.prepare_callback = timing_callback

    def sample(steps, seed=a.seed):
        if steps == 20:
            plan = sampling_args.plan_sampling("Default 20", size, size)
        else:
            plan = sampling_args.plan_sampling("custom", size, size, steps=steps, polish_steps=min(2, steps - 1))
        marks.clear()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        latent = e2e.sample_with(a.sampler, models, ctx, plan, size, seed)
        torch.cuda.synchronize()
        times = [a_.elapsed_time(b) for a_, b in zip([start, *marks[:-1]], marks, strict=True)]
        return latent, times

    def image(seed):
        """One run as a user waits for it: from the node call until the latent is on the host."""
        before = _model_counters(models)
        t0 = time.perf_counter()
        latent, times = sample(a.steps, seed)
        latent = latent.float().cpu()
        seconds = time.perf_counter() - t0
        record = {
            "seed": seed,
            "seconds": round(seconds, 3),
            "steps": len(times),
            "step_ms_median": round(statistics.median(times), 1),
            "step_ms": [round(t, 1) for t in times],
            **{k: v - before.get(k, 0) for k, v in _model_counters(models).items()},
        }
        return latent, times, record

    import comfy.patcher_extension

    timers = {}
    for label, m in zip(("conditional", "unconditional"), models, strict=False):
        timers[label] = _PassTimer()
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, "bench_pass_timer", timers[label])
    kernels.REGISTRY.clear()
    frames = e2e.compiled_frames()
    # the images, back to back: the first after the load (autotuning done by an earlier process unless the caches
    # are empty; the streaming plan; graph captures; compiled: tracing and code generation too), then the warm ones,
    # the last with the first's seed (a replayed run must give the same latent); the last one's steps are the step
    # table's, with the pass timers on and the streaming counters reset before it
    images, first_latent = [], None
    for i in range(a.images):
        last = i == a.images - 1
        seed = a.seed if last and a.images > 1 else a.seed + i
        if last:
            _server_cleanup()
            for m in models:  # the timed steps' copies only
                stream = getattr(m.model, "ideogram4_stream", None)
                if stream is not None:
                    stream.streamer.reset_stats()
            e2e._reset_peaks()
            peak[0] = 0
            for t in timers.values():
                t.on = True
            before = torch.cuda.memory_stats()
            warm = e2e.compiled_frames()
            with ClockWatch() as watch:  # the clock the steps ran at (a denser, compiled run may hold it lower)
                latent, times, record = image(seed)
        else:
            latent, times, record = image(seed)
            _server_cleanup()  # what ComfyUI's executor does after each node
        images.append(record)
        if i == 0:
            first_latent = latent
            out["warmup_s"] = record["seconds"]
    out["images"] = images
    out["image_s_first"] = images[0]["seconds"]
    if len(images) > 1:
        out["image_s_warm_median"] = round(statistics.median(r["seconds"] for r in images[1:]), 3)
        out["latent_equal_first"] = bool(torch.equal(latent, first_latent))
    if compile_mode:  # frames dynamo compiled during the warm-up, and during the timed steps (recompiles: want 0)
        out["frames_compiled"] = {"warmup": warm - frames, "timed_steps": e2e.compiled_frames() - warm}
    out["sm_mhz_median"], out["watts_median"] = watch.sm_mhz, watch.watts
    after = torch.cuda.memory_stats()
    # the caching allocator's work in the timed steps: a retry is a failed cudaMalloc under the cap, answered by
    # freeing the cache after a synchronize (the host stops feeding the device)
    out["allocator"] = {k: after.get(k, 0) - before.get(k, 0) for k in ALLOCATOR_COUNTERS}
    for t in timers.values():
        t.on = False
    out["pass_ms"] = {label: t.summary() for label, t in timers.items()}
    out.update(
        step_ms_min=round(min(times), 1),
        step_ms_median=round(statistics.median(times), 1),
        step_ms=[round(t, 1) for t in times],
    )
    held = torch.cuda.memory_reserved()
    out["peak_gib"] = round(max(peak[0] - ballast_bytes, 0) / GIB, 2)  # the card's use at step ends, context in
    out["torch_peak_reserved_gib"] = round((torch.cuda.max_memory_reserved() - ballast_bytes) / GIB, 2)
    out["held_gib_end"] = round((held - ballast_bytes) / GIB, 2)
    if torch.cuda.device_count() > 1:  # a two-GPU peer: the other cards' peaks (no ballast there)
        out["torch_peak_reserved_gib_per_card"] = {
            f"cuda:{i}": round(torch.cuda.max_memory_reserved(i) / GIB, 2) for i in range(1, torch.cuda.device_count())
        }
    if a.kernels:  # one more run under the profiler: the kernels per step, for bench/kernel_table.py
        out.update(_profiled_run(sample, step_hooks, a.steps, a.kernel_steps))
    if a.host_profile:  # one more 2-step run under cProfile: where the host's time goes (per step)
        out["host_profile"] = host_profile(lambda: sample(2), steps=2)
    streams = [streaming_patcher.stream_report(m) for m in models]
    out["streaming"] = streams
    live = [s for s in streams if s]
    out["gib_streamed_per_step"] = round(sum(s["gib_streamed_per_forward"] for s in live), 3)
    out["copy_ms_per_step"] = round(sum(s["copy_ms_per_forward"] for s in live), 2)
    out["wait_ms_per_step"] = round(sum(s["wait_ms_per_forward"] for s in live), 2)
    out["copies_hidden"] = all(s["hidden"] for s in live) if live else None
    out["paths"] = {m: kernels.REGISTRY.counts(m) for m in kernels.REGISTRY.models()}
    notes = {m: kernels.REGISTRY.model_notes(m) for m in kernels.REGISTRY.models()}
    out["panel_notes"] = {m: n.get(streaming_patcher.NOTE_KIND) for m, n in notes.items() if n}
    out["graph_notes"] = {m: n.get(cuda_graphs.NOTE_KIND) for m, n in notes.items() if n.get(cuda_graphs.NOTE_KIND)}
    if a.latents:
        pathlib.Path(a.latents).mkdir(parents=True, exist_ok=True)
        torch.save(latent.float().cpu(), pathlib.Path(a.latents) / f"{peer}@{_cap_name(json.loads(a.child)['cap'])}.pt")
    out["loaded"] = [type(m).__name__ for m in models]
    return out


def _model_counters(models) -> dict:
    """Counters of what a run did to the MODELs beyond sampling: streaming plans applied, graph captures, graph pools
    released (each a cost a run after the first should not pay while nothing else claimed the card)."""
    from ..ideogram4 import graph_replay

    out = {"plan_changes": 0, "graph_captures": 0, "graph_pool_releases": 0}
    pools = set()
    for m in dict.fromkeys(models):
        dm = m.model.diffusion_model
        out["plan_changes"] += getattr(m.model, "ideogram4_plan_changes", 0)
        graphs = getattr(dm, graph_replay.MODEL_ATTR, None)
        if graphs is not None:
            out["graph_captures"] += graphs.stats.captures
            if graphs._pool is not None and id(graphs._pool) not in pools:
                pools.add(id(graphs._pool))
                out["graph_pool_releases"] += graphs._pool.releases
    return out
