"""One ``--vram`` run in a process of its own (started by ``parent.py``, its job in ``--child``): one peer on one card
size, or one layout's files written. The run:

* sets ComfyUI's model management up as its server does (``--setup server``): comfy-aimdo's DynamicVRAM where it
  initializes on this machine (``control.init`` before ComfyUI's model management is imported, ``init_devices``
  after, the server's per-node clean-up between loading and sampling) and async offload; the result says whether
  DynamicVRAM came up and why not (``comfyui.setup_comfyui``);
* emulates a card of ``--vram`` GiB with a hard cap: right after CUDA starts it takes everything above the card's
  size (its own CUDA context counted in) as one allocation, so ComfyUI's loading decisions read that card's free
  memory and nothing in the process can allocate past it (``device.take_all_but``);
* loads both branches, samples ``--images`` runs of ``--steps`` steps back to back, and reports the seconds of each
  image, min / median of the last run's per-step times (an event recorded at each step's callback, no
  synchronization, as in a server run without previews), the peak device memory (context included), the bytes the
  pack streamed per step, its copy time and whether the copies were hidden, and the pinned host→device bandwidth.

A compiled run (``--compile MODE``, whole GPU only) compiles its MODELs as ComfyUI's TorchCompileModel compiles them
(``peers.compiled_clones``) before its first image (which then traces, generates code and autotunes: ``warmup_s``).
The entry goes to the parent as one ``CHILD_RESULT <json>`` line on stdout.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import statistics
import time

import torch

from ..timing import ClockWatch
from .comfyui import comfyui_version, server_cleanup, setup_comfyui
from .device import GIB, bandwidth, reset_peaks, take_all_but
from .peers import (
    PEER_COMFY_ARGS,
    TEXT_ENCODER,
    TEXT_TOKENS,
    WIDTH,
    compiled_clones,
    compiled_frames,
    config_for,
    load_models,
    sample_with,
    write_layout,
)
from .report import cap_name


def run(a) -> dict:
    job = json.loads(a.child)
    if job.get("write"):
        return _child_write(a, job["write"])
    peer, cap = job["peer"], float(job["cap"])
    entry: dict = {"peer": peer, "vram_gib": cap}
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("comfyui_ideogram4_int8").setLevel(logging.DEBUG)
    try:
        entry.update(bandwidth())
        entry["dynamic_vram"] = setup_comfyui(a.comfyui, server=a.setup == "server", options=PEER_COMFY_ARGS.get(peer))
        ballast = take_all_but(cap)  # held for the whole run: the emulated card's edge
        extra = ballast.numel() if ballast is not None else 0
        entry["ballast_gib"] = round(extra / GIB, 2)
        files = {b: pathlib.Path(p) for b, p in job["files"].items()}
        entry.update(_run_peer(a, peer, files, extra, job.get("compile"), job.get("text_encoder"), job.get("vae")))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which keeps the other runs
        import traceback

        entry["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
    print("CHILD_RESULT " + json.dumps(entry), flush=True)
    return entry


def _child_write(a, layout: str) -> dict:
    config = config_for(a)
    entry = {}
    try:
        if layout == TEXT_ENCODER:  # its keys come from ComfyUI's own encoder module
            setup_comfyui(a.comfyui, server=False)
        files = write_layout(layout, config, pathlib.Path(a.workdir), a.seed)
        entry["files"] = {b: str(p) for b, p in files.items()}
    except Exception as exc:  # noqa: BLE001
        entry["error"] = f"{type(exc).__name__}: {exc}"
    print("CHILD_RESULT " + json.dumps(entry), flush=True)
    return entry


class _PassTimer:
    """``APPLY_MODEL`` wrapper: per pass, the host time of the model call (kernel launches and Python; a wait inside
    it counts too) and the GPU time between events on the pass's own device. Host time close to GPU time means the
    pass is bound by its launches (two passes on two cards then take turns on one interpreter). Added after a
    compile wrapper (``peers.compiled_clones``), it runs inside it but outside the compiled diffusion model: dynamo
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

    from ..step_profile import StepProfile, middle_steps

    prof = StepProfile(middle_steps(steps, count), activities or [ProfilerActivity.CUDA])
    step_hooks.append(prof.step_done)
    try:
        with prof:
            sample(steps)
    finally:
        step_hooks.remove(prof.step_done)
    return prof.report()


ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


def _run_peer(
    a,
    peer: str,
    files: dict,
    ballast_bytes: int,
    compile_mode: str | None = None,
    text_encoder: str | None = None,
    vae_file: str | None = None,
) -> dict:
    import latent_preview

    from ... import kernels
    from ...ideogram4 import sampling_args
    from ...kernels import model_notes
    from ...nodes import sampler_nodes
    from ...nodes.runtime import cuda_graphs, streaming_patcher

    config = config_for(a)
    size = a.size or WIDTH
    g = torch.Generator().manual_seed(1234)
    ctx = torch.randn(1, TEXT_TOKENS, config.llm_features_dim, generator=g).bfloat16()
    out = {"comfyui": comfyui_version(a.comfyui)}
    t0 = time.perf_counter()
    models, notes = load_models(peer, files, config)
    out["load_s"] = round(time.perf_counter() - t0, 1)
    out.update(notes)
    if compile_mode:  # as TorchCompileModel on both MODELs; the warm-up below compiles
        models = compiled_clones(models, compile_mode)
        out["compiled"] = compile_mode
    prompts = None
    if text_encoder:  # the prompt cycle: ComfyUI's text encoder loaded as CLIPLoader loads it, once
        from .. import text_encoder as te

        t0 = time.perf_counter()
        prompts = te.load(text_encoder)
        out["text_encoder_load_s"] = round(time.perf_counter() - t0, 1)
    vae = None
    if vae_file:  # VAE Decode after each image: the VAE loaded as VAELoader loads it, once
        from .. import flux2_vae

        t0 = time.perf_counter()
        vae = flux2_vae.load(vae_file)
        out["vae_load_s"] = round(time.perf_counter() - t0, 1)
    server_cleanup()
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
        latent = sample_with(a.sampler, models, ctx, plan, size, seed)
        torch.cuda.synchronize()
        times = [a_.elapsed_time(b) for a_, b in zip([start, *marks[:-1]], marks, strict=True)]
        return latent, times

    before_decode: dict = {}  # the caching allocator before the last decode: the sampling's own numbers

    def decode(latent, record):
        """VAE Decode on the image's latent, as the next node: the executor's clean-up after the sampler, then the
        node's call until the image exists; what ComfyUI left of each MODEL on the card before and after it (its
        memory request may unload or shrink them: the next image then loads them again)."""
        from .. import flux2_vae

        server_cleanup()
        before_decode.update(
            peak=torch.cuda.max_memory_reserved(),
            held=torch.cuda.memory_reserved(),
            stats=torch.cuda.memory_stats(),
            streams=[streaming_patcher.stream_report(m) for m in models],  # the decode may unload a branch
        )
        record["models_loaded_gib_before_decode"] = [round(_on_card(m) / GIB, 2) for m in models]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        flux2_vae.decode(vae, latent)
        torch.cuda.synchronize()
        record["decode_s"] = round(time.perf_counter() - t0, 3)
        record["models_loaded_gib_after_decode"] = [round(_on_card(m) / GIB, 2) for m in models]

    def image(seed, index=0):
        """One run as a user waits for it: from the node call until the latent is on the host; with the prompt
        cycle, a new prompt encoded first (the encode node's call until its features exist on the device); with
        ``--decode``, the VAE Decode of its latent after it (inside the pack's log of the image)."""
        nonlocal ctx
        before = _model_counters(models)
        record = {"seed": seed}
        with _pack_log() as pack_log, _file_reads() if prompts is not None else contextlib.nullcontext() as reads:
            if prompts is not None:
                from .. import text_encoder as te

                record["text_encoder_before"] = te.memory_state(prompts)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                cond = te.encode(prompts, te.PROMPTS[index % len(te.PROMPTS)])
                ctx = cond[0][0]
                torch.cuda.synchronize()
                record["encode_s"] = round(time.perf_counter() - t0, 3)
                record["text_tokens"] = int(ctx.shape[1])
            t0 = time.perf_counter()
            latent, times = sample(a.steps, seed)
            latent = latent.float().cpu()
            seconds = time.perf_counter() - t0
            if prompts is not None:
                record["text_encoder_after_sampling"] = te.memory_state(prompts)
            if vae is not None:
                decode(latent, record)
        if vae is not None:
            record["image_decode_s"] = round(seconds + record["decode_s"], 3)
        if prompts is not None:
            record["cycle_s"] = round(record["encode_s"] + seconds + record.get("decode_s", 0), 3)
            record["files_read"] = reads
        record.update(
            seconds=round(seconds, 3),
            steps=len(times),
            step_ms_median=round(statistics.median(times), 1),
            step_ms=[round(t, 1) for t in times],
            **{k: v - before.get(k, 0) for k, v in _model_counters(models).items()},
        )
        if pack_log:  # what the pack's patcher did to the models during the run (loads, budgets, plans)
            record["pack_log"] = pack_log[:PACK_LOG_LINES]
        return latent, times, record

    import comfy.patcher_extension

    timers = {}
    for label, m in zip(("conditional", "unconditional"), models, strict=False):
        timers[label] = _PassTimer()
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, "bench_pass_timer", timers[label])
    model_notes.forget()
    frames = compiled_frames()
    # the images, back to back: the first after the load (autotuning done by an earlier process unless the caches
    # are empty; the streaming plan; graph captures; compiled: tracing and code generation too), then the warm ones,
    # the last with the first's seed (a replayed run must give the same latent); the last one's steps are the step
    # table's, with the pass timers on and the streaming counters reset before it
    images, first_latent = [], None
    for i in range(a.images):
        last = i == a.images - 1
        again = last and a.images > 1  # the first image's seed (and prompt) again: a replayed run's latent
        seed = a.seed if again else a.seed + i
        prompt = 0 if again else i
        if last:
            server_cleanup()
            for m in models:  # the timed steps' copies only
                stream = getattr(m.model, "ideogram4_stream", None)
                if stream is not None:
                    stream.streamer.reset_stats()
            reset_peaks()
            peak[0] = 0
            for t in timers.values():
                t.on = True
            before = torch.cuda.memory_stats()
            warm = compiled_frames()
            with ClockWatch() as watch:  # the clock the steps ran at (a denser, compiled run may hold it lower)
                latent, times, record = image(seed, prompt)
        elif (i == 0 and a.profile_first) or (i == 1 and a.profile_warm):  # where its host time goes, in its record
            ran: list = []
            profile = host_profile(lambda s=seed, p=prompt, out=ran: out.append(image(s, p)), steps=1, top=120)
            (latent, times, record), record["host_profile"] = ran[0], profile
            server_cleanup()
        else:
            latent, times, record = image(seed, prompt)
            server_cleanup()  # what ComfyUI's executor does after each node
        images.append(record)
        if i == 0:
            first_latent = latent
            out["warmup_s"] = record["seconds"]
    out["images"] = images
    out["image_s_first"] = images[0]["seconds"]
    if prompts is not None:
        out["cycle_s_first"] = images[0]["cycle_s"]
        if len(images) > 1:
            out["cycle_s_warm_median"] = round(statistics.median(r["cycle_s"] for r in images[1:]), 3)
        out["files_read_in_cycles"] = sum(sum(r["files_read"].values()) for r in images[1:])
    if vae is not None:
        out.update(decode_summary(images))
    if len(images) > 1:
        out["image_s_warm_median"] = round(statistics.median(r["seconds"] for r in images[1:]), 3)
        out["latent_equal_first"] = bool(torch.equal(latent, first_latent))
    if compile_mode:  # frames dynamo compiled during the warm-up, and during the timed steps (recompiles: want 0)
        out["frames_compiled"] = {"warmup": warm - frames, "timed_steps": compiled_frames() - warm}
    out["sm_mhz_median"], out["watts_median"] = watch.sm_mhz, watch.watts
    after = before_decode.get("stats") or torch.cuda.memory_stats()
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
    held = before_decode.get("held", torch.cuda.memory_reserved())
    out["peak_gib"] = round(max(peak[0] - ballast_bytes, 0) / GIB, 2)  # the card's use at step ends, context in
    reserved = torch.cuda.max_memory_reserved()
    if vae is not None:  # the last image's peak with its decode; the sampling's own stays the one below
        out["peak_reserved_gib_with_decode"] = round((reserved - ballast_bytes) / GIB, 2)
        reserved = before_decode["peak"]
    out["torch_peak_reserved_gib"] = round((reserved - ballast_bytes) / GIB, 2)
    out["held_gib_end"] = round((held - ballast_bytes) / GIB, 2)
    if torch.cuda.device_count() > 1:  # a two-GPU peer: the other cards' peaks (no ballast there)
        out["torch_peak_reserved_gib_per_card"] = {
            f"cuda:{i}": round(torch.cuda.max_memory_reserved(i) / GIB, 2) for i in range(1, torch.cuda.device_count())
        }
    if a.kernels:  # one more run under the profiler: the kernels per step, for bench/kernel_table.py
        out.update(_profiled_run(sample, step_hooks, a.steps, a.kernel_steps))
    if a.host_profile:  # one more 2-step run under cProfile: where the host's time goes (per step)
        out["host_profile"] = host_profile(lambda: sample(2), steps=2)
    streams = before_decode.get("streams") or [streaming_patcher.stream_report(m) for m in models]
    out["streaming"] = streams
    live = [s for s in streams if s]
    out["gib_streamed_per_step"] = round(sum(s["gib_streamed_per_forward"] for s in live), 3)
    out["copy_ms_per_step"] = round(sum(s["copy_ms_per_forward"] for s in live), 2)
    out["wait_ms_per_step"] = round(sum(s["wait_ms_per_forward"] for s in live), 2)
    out["copies_hidden"] = all(s["hidden"] for s in live) if live else None
    out["paths"] = {m: kernels.REGISTRY.counts(m) for m in kernels.REGISTRY.models()}
    notes = {m: model_notes.notes(m) for m in kernels.REGISTRY.models()}
    out["panel_notes"] = {m: n.get(streaming_patcher.NOTE_KIND) for m, n in notes.items() if n}
    out["graph_notes"] = {m: n.get(cuda_graphs.NOTE_KIND) for m, n in notes.items() if n.get(cuda_graphs.NOTE_KIND)}
    if a.latents:
        pathlib.Path(a.latents).mkdir(parents=True, exist_ok=True)
        torch.save(latent.float().cpu(), pathlib.Path(a.latents) / f"{peer}@{cap_name(json.loads(a.child)['cap'])}.pt")
    out["loaded"] = [type(m).__name__ for m in models]
    return out


def _on_card(model) -> int:
    """Bytes of a MODEL's weights on the card: a streaming or parked pack MODEL reports its whole size to ComfyUI as
    loaded (``Ideogram4ModelPatcher.loaded_size``), its real use is ``model_loaded_weight_memory``."""
    if hasattr(model, "streaming_minimum"):  # the pack's patcher
        return model.model.model_loaded_weight_memory
    return model.loaded_size()


def decode_summary(images: list) -> dict:
    """A ``--decode`` run's keys from its image records: the first image with its decode, and the medians of the
    warm ones (2..N) of the decode and of the image with it."""
    out = {"image_decode_s_first": images[0]["image_decode_s"]}
    if len(images) > 1:
        for key in ("decode_s", "image_decode_s"):
            out[f"{key}_warm_median"] = round(statistics.median(r[key] for r in images[1:]), 3)
    return out


@contextlib.contextmanager
def _file_reads():
    """Counts, while open, the calls that open a model file: ComfyUI's ``load_torch_file`` (under DynamicVRAM it reads
    safetensors without ``safe_open``) and safetensors' ``safe_open`` (the pack's reads and ComfyUI's others). A prompt
    after the first must open none."""
    import comfy.utils
    import safetensors

    counts = {"load_torch_file": 0, "safe_open": 0}
    saved = [
        (comfy.utils, "load_torch_file", comfy.utils.load_torch_file),
        (safetensors, "safe_open", safetensors.safe_open),
    ]

    def counted(fn, name):
        def call(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return call

    for mod, name, fn in saved:
        setattr(mod, name, counted(fn, name))
    try:
        yield counts
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


PACK_LOG_LINES = 24


@contextlib.contextmanager
def _pack_log():
    """The pack's log lines (debug included) of one run, kept for its image record instead of printed."""
    import logging

    lines: list[str] = []
    start = time.perf_counter()

    class _Keep(logging.Handler):
        def emit(self, record):  # seconds since the image started, then the message
            lines.append(f"+{time.perf_counter() - start:.2f}s {record.getMessage()[:300]}")

    logger = logging.getLogger("comfyui_ideogram4_int8")
    handler, level, propagate = _Keep(logging.DEBUG), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _model_counters(models) -> dict:
    """Counters of what a run did to the MODELs beyond sampling: streaming plans applied, graph captures, graph pools
    released (each a cost a run after the first should not pay while nothing else claimed the card)."""
    from ...ideogram4 import graph_replay

    out = {"plan_changes": 0, "graph_captures": 0, "graph_pool_releases": 0}
    pools = set()
    for m in dict.fromkeys(models):
        dm = m.model.diffusion_model
        out["plan_changes"] += getattr(m.model, "ideogram4_plan_changes", 0)
        graphs = getattr(dm, graph_replay.MODEL_ATTR, None)
        if graphs is not None:
            out["graph_captures"] += graphs.stats.captures
            if graphs.pool is not None and id(graphs.pool) not in pools:
                pools.add(id(graphs.pool))
                out["graph_pool_releases"] += graphs.pool.releases
    return out
