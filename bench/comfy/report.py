"""The ComfyUI benchmark's results: the ratios added after the runs, every table it prints, its plot, and the schema.

The result (``--out``) has the shape of ``bench/report.py``: ``{"info": {...}, "peers": {...}}`` from the in-process
run, ``{"info": {...}, "runs": {...}}`` from ``--vram``. An entry that failed has ``error``; any key below may be
missing from an entry whose run did not get that far or did not ask for it.

In-process run (``inprocess.run``; ``peer_ratios``, ``print_peers``, ``figure``)
  info   gpu, torch, triton, date, command, comfyui (its version), layers, size ("WxH"), text_tokens, steps, sampler,
         backends (``kernels.backends.report()``), cached_launches
  peers  "<peer>", and "<peer> compiled:<mode>" per ``--compile`` mode:
         layout; load_s; the load's notes (comfy_kitchen, <branch>_patch, lora, placement); sm_mhz_median,
         watts_median (``timing.ClockWatch``); sample_ms (the ``--steps`` run), step_ms (its mean); peak_gib,
         peak_gib_per_card (two cards); paths ({branch: {GEMM path: layers}}); latent_cosine_vs_bf16;
         speedup_vs_<native> (``NATIVE``: its step against the native peer's, compiled alike);
         compiled runs: compiled, frames_compiled ({warmup, timed_steps}), compile_s, speedup_vs_eager

``--vram`` (``parent.run``, one ``child.run`` process a run; ``card_ratios``, ``print_cards``, ``print_passes``,
``print_images``)
  info   command, layers, size, steps, setup, sampler, vram_gib (the card sizes), images, decode; cold and warmups
         (the first-ever image, the throw-away runs: peer, vram_gib, load_s, image_s, step_ms_median, decode_s,
         error); gpu, torch, triton, comfyui, pinned_gib_s, pageable_gib_s (from the first child that has them)
  runs   "<peer>[ compiled:<mode>]@<card>", the card "resident" (the whole GPU) or "<GiB>GB" (``cap_name``):
         peer, vram_gib, gpu, torch, triton, pinned_gib_s, pageable_gib_s (host-to-device GiB/s), dynamic_vram,
         ballast_gib, comfyui, load_s and the load's notes, compiled, warmup_s (the first image's seconds);
         images (per sampling run: seed, seconds, steps, step_ms_median, step_ms, plan_changes, graph_captures,
         graph_pool_releases), image_s_first, image_s_warm_median, latent_equal_first (the last run replays the
         first's seed); frames_compiled; sm_mhz_median, watts_median; allocator (the caching allocator's counters
         in the timed steps); pass_ms ({branch: {passes, host_ms_median, gpu_ms_median}}); step_ms_min,
         step_ms_median, step_ms (the last image's steps); peak_gib, torch_peak_reserved_gib, held_gib_end,
         torch_peak_reserved_gib_per_card; with --kernels: kernels, bus, profile, per_run (``bench/step_profile.py``,
         ``bench/kernel_table.py``); with --host-profile: host_profile ({self, cumulative, unit}); with --profile-first:
         the first image record's host_profile (ms in the whole image); streaming (each
         MODEL's stream report or null), gib_streamed_per_step, copy_ms_per_step, wait_ms_per_step, copies_hidden;
         paths, panel_notes, graph_notes, loaded; process_s; with --prompts: text_encoder_load_s, per image
         encode_s, text_tokens, cycle_s, files_read ({load_torch_file, safe_open, open_safetensors} calls),
         cycle_s_first, cycle_s_warm_median, files_read_in_cycles (after the first prompt); with --decode: vae_load_s,
         per image decode_s, image_decode_s (seconds + decode_s; cycle_s has it too), models_loaded_gib_before_decode
         and _after_decode (GiB per MODEL), decode_s_warm_median, image_decode_s_warm_median, image_decode_s_first,
         peak_reserved_gib_with_decode (the last image's; the other memory keys are the sampling's)
         added by ``card_ratios``: speedup_vs_eager, eager_sm_mhz (compiled runs), x_own_resident,
         x_ours_resident, floor_ms, speedup_vs_<native>; image_s_floor, image_x_floor, image_x_steps,
         image_s_bus_floor (no resident run of the peer), image_speedup_vs_<native>, cycle_speedup_vs_<native>,
         image_decode_speedup_vs_<native> (``image_ratios``); by ``parent.compare_latents`` (``--latents``):
         latent_max_abs_vs_resident, latent_cosine_vs_resident
"""

from __future__ import annotations

import functools
import json
import pathlib
import sys

from ..report import print_runs, two_places

COMPILED = " compiled:"  # "<peer> compiled:<mode>": a run of the peer's MODELs under TorchCompileModel
NATIVE = ("native-bf16", "native-fp8", "native-fp8-fast", "native-int8-convrot", "native-fp8-ck-attention")


def cap_name(cap: float) -> str:
    return "resident" if not cap else f"{cap:g}GB"


# -- the in-process run ------------------------------------------------------------------------------------------------
def vs_natives(e: dict, natives: dict, key: str, prefix: str) -> None:
    """``e["<prefix>_vs_<native>"]`` = the native run's ``key`` over ``e``'s, for each run of ``natives`` ({native:
    its entry on the same card, compiled alike}) that has it."""
    mine = e.get(key)
    for ref, other in natives.items():
        theirs = other.get(key)
        if mine and theirs:
            e[f"{prefix}_vs_{ref}"] = round(theirs / mine, 3)


def peer_ratios(result: dict) -> None:
    peers = result["peers"]
    for entry in peers.values():
        suffix = f" compiled:{entry['compiled']}" if entry.get("compiled") else ""  # against peers compiled alike
        vs_natives(entry, {ref: peers.get(ref + suffix, {}) for ref in NATIVE}, "step_ms", "speedup")


def print_peers(result: dict) -> None:
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


# -- --vram: a process a run -------------------------------------------------------------------------------------------
def card_ratios(result: dict) -> None:
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
        natives = {ref: runs.get(f"{ref}{suffix}@{cap}", {}) for ref in NATIVE}
        vs_natives(e, natives, "step_ms_median", "speedup")
        image_ratios(e, runs, peer, natives)


def image_ratios(e: dict, runs: dict, peer: str, natives: dict) -> None:
    """Per image: the floor (steps x the larger of the peer's resident step and the bytes it streamed per step over
    the pinned bandwidth; without a resident run of the peer in the result, only the bus part, as
    ``image_s_bus_floor``), the warm image against it, and the ratio to each native peer's warm image on that card."""
    if not e.get("images"):
        return
    steps = e["images"][-1]["steps"]
    resident = runs.get(f"{peer}@resident", {}).get("step_ms_median")
    bw = e.get("pinned_gib_s")
    streamed = (e.get("gib_streamed_per_step") or 0) / bw * 1e3 if bw else 0
    if resident:
        e["image_s_floor"] = round(steps * max(resident, streamed) / 1e3, 3)
    else:
        e["image_s_bus_floor"] = round(steps * streamed / 1e3, 3)
    warm = e.get("image_s_warm_median")
    if not warm:
        return
    if resident:
        e["image_x_floor"] = round(warm / e["image_s_floor"], 3)
    e["image_x_steps"] = round(warm / (steps * e["step_ms_median"] / 1e3), 3)  # what the step median does not show
    vs_natives(e, natives, "image_s_warm_median", "image_speedup")
    vs_natives(e, natives, "cycle_s_warm_median", "cycle_speedup")
    vs_natives(e, natives, "image_decode_s_warm_median", "image_decode_speedup")


def print_cards(result: dict) -> None:
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

    def row(e):
        r = functools.partial(two_places, e)
        equal = {True: "yes", False: "NO", None: "-"}[e.get("latent_equal_first")]
        counts = e["images"][-1] if e.get("images") else {}
        return (
            f"{e.get('image_s_first', 0):>8.2f}{e.get('image_s_warm_median', 0):>8.2f}{r('image_s_floor'):>8}"
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
    for name, e in runs.items():  # --prompts: the prompt cycle (a new prompt encoded, then the image)
        if e.get("cycle_s_warm_median"):
            encodes = [r.get("encode_s") for r in e["images"]]
            print(
                f"{name:<34} prompt cycle: first {e['cycle_s_first']:.2f} s, warm {e['cycle_s_warm_median']:.2f} s "
                f"({two_places(e, 'cycle_speedup_vs_native-fp8', 'x')} native fp8), encodes {encodes} s, files read "
                f"again after the first prompt: {e.get('files_read_in_cycles')}"
            )
            states = [r.get("text_encoder_before") for r in e["images"][1:] if r.get("text_encoder_before")]
            if states:  # was the encoder still listed, its pages and pins kept, at each warm encode
                print(f"{name:<34} text encoder at the warm encodes: " + "; ".join(json.dumps(t) for t in states))
    for name, e in runs.items():  # --decode: VAE Decode after each image
        if e.get("image_decode_s_first"):
            print(f"{name:<34} {_decode_line(e)}")
    for key in ("cold", "warmups"):
        if info.get(key):
            print(f"{key}: {json.dumps(info[key])}")


def _decode_line(e: dict) -> str:
    """A run's images with VAE Decode after each: first and warm seconds, the ratios to native fp8 and bf16, the
    decodes, and what they left of the MODELs on the card (an unload there is a reload in the next image)."""
    r = functools.partial(two_places, e, unit="x")
    decodes = [r_.get("decode_s") for r_ in e["images"]]
    warm = e["images"][1:]
    after = [r_.get("models_loaded_gib_after_decode") for r_ in warm]
    before = [r_.get("models_loaded_gib_before_decode") for r_ in warm]
    shrunk = sum(1 for b, a in zip(before, after, strict=True) if b and a and sum(a) < sum(b))
    return (
        f"with decode: first {e['image_decode_s_first']:.2f} s, warm {e.get('image_decode_s_warm_median', 0):.2f} s "
        f"({r('image_decode_speedup_vs_native-fp8')} native fp8, {r('image_decode_speedup_vs_native-bf16')} native "
        f"bf16), decodes {decodes} s, MODELs shrunk by a warm decode: {shrunk} of {len(warm)}, warm captures / plan "
        f"changes: {sum(r_.get('graph_captures', 0) for r_ in warm)} / {sum(r_.get('plan_changes', 0) for r_ in warm)}"
    )


def print_passes(result: dict) -> None:
    """Per run and branch: the median host and GPU time of one pass (``child._PassTimer``)."""
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
            for which, image in zip(("first", "second"), e.get("images") or [], strict=False):
                rows = list((image.get("host_profile") or {}).get(key, {}).items())[:12]
                if rows:
                    shown = "; ".join(f"{k[-60:]} {v[0]}" for k, v in rows)
                    print(f"{name:<34} {which} image, host {key} ms: {shown}")
        alloc = e.get("allocator")
        if alloc and any(alloc.values()):
            print(f"{name:<34} allocator in the timed steps: " + ", ".join(f"{k} {v}" for k, v in alloc.items()))


def _per_run_line(e: dict) -> str:
    from ..kernel_table import coverage

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
