"""``python -m comfyui_ideogram4_int8 demo``: the pack's main job on an embedded tiny model.

1. builds a small Ideogram-4-architecture DiT pair (conditional + unconditional) with seeded
   random weights, outlier channels and SmoothQuant vectors;
2. writes it as a transformerlab-layout W8A8 file (both branches, protected bf16 layers);
3. loads both branches back through ``read_branch`` into W8A8 DiTs;
4. samples a latent with a preset through the W8A8 path (the fused Triton GEMM on a CUDA GPU;
   on the CPU whichever of cublas-int8 and dequant-bf16 this CPU measured faster) and the same sampling
   with the float models;
5. writes a labelled PNG preview (W8A8 | bf16 reference | their difference, with the GEMM path and
   the fidelity figures), prints the GEMM-path table and the W8A8-vs-bf16 fidelity (each row naming the path
   that ran in it), and writes ``demo_summary.json``.

On the CPU the demo runs torch on one thread per physical core this process may use that other jobs do not keep
busy (``default_threads``), unless told otherwise (``--threads``, or ``OMP_NUM_THREADS`` in the environment): one
thread left an idle second core unused, while two threads on cores other jobs keep busy wait on each other at every
parallel op (README: the measured times).
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import torch

from .. import kernels
from ..kernels import model_notes
from .checkpoint import read_branch
from .config import Ideogram4Config
from .dit import Ideogram4DiT
from .preview import difference_to_rgb, latents_to_rgb, save_labelled_preview
from .sampler import make_noise, sample
from .schedule import get_preset
from .synthetic import RandomWeights, write_w8a8
from .w8a8_module import dequant_linears, float_linears, w8a8_linears

MODEL_SEEDS = {"conditional": 4, "unconditional": 5}  # the embedded default model
TEXT_TOKENS = 24
DEMO_SIZE = 256  # pixels: a 16 x 16 latent, 256 image tokens
FIDELITY_MIN = 0.99
DIFF_GAIN = 50.0
LATENT_KEY = "sampled latent: W8A8 vs bf16 (cosine)"


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def seconds_since_process_start() -> float | None:
    """Wall time since this process started (Python's start and its imports included), from Linux's /proc; None
    where the OS does not say."""
    try:
        stat = pathlib.Path("/proc/self/stat").read_text()
        uptime = float(pathlib.Path("/proc/uptime").read_text().split()[0])
        # after the command name (in parentheses, may hold spaces) come fields 3.. of proc(5); field 22 is the start
        # time in clock ticks since boot
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _device(name: str | None) -> torch.device:
    if name:
        dev = torch.device(name)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("demo: --device cuda asked for, but torch sees no CUDA GPU (use --device cpu)")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def path_table(labels: list[str]) -> list[dict]:
    """Rows (model, path, layers, reason) from kernels.REGISTRY for the given model labels."""
    rows = []
    for label in labels:
        groups: dict[tuple[str, str], int] = {}
        for rec in kernels.REGISTRY.layers(label):
            key = (rec.path, rec.reason or "fastest path")
            groups[key] = groups.get(key, 0) + 1
        for (path, reason), n in sorted(groups.items(), key=lambda kv: kernels.PATHS.index(kv[0][0])):
            rows.append({"model": label, "path": path, "layers": n, "reason": reason})
    return rows


def _print_table(rows: list[dict]) -> None:
    print(f"\n{'model':<14} {'GEMM path':<13} {'layers':>6}  why not a faster path")
    print("-" * 100)
    for r in rows:
        print(f"{r['model']:<14} {r['path']:<13} {r['layers']:>6}  {r['reason']}")


def _print_fidelity(fidelity: dict[str, float], rel_latent: float) -> None:
    rows = [(k.removesuffix(" (cosine)"), "cosine similarity (1 = identical)", v) for k, v in fidelity.items()]
    rows.append((LATENT_KEY.removesuffix(" (cosine)"), "relative L2 error (0 = identical)", rel_latent))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'fidelity':<{width}} {'measure':<34} value")
    print("-" * (width + 42))
    for what, measure, value in rows:
        print(f"{what:<{width}} {measure:<34} {value:.5f}")


def physical_cores(cpuinfo: str | None = None, allowed: set[int] | None = None) -> int:
    """Physical cores among the CPUs this process may run on (``allowed``, default its affinity): distinct
    (physical id, core id) pairs of /proc/cpuinfo; where those fields are missing, the number of allowed CPUs."""
    if allowed is None:
        allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    cores = set()
    for block in cpuinfo.strip().split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "processor" not in fields or "core id" not in fields:
            continue
        if fields["processor"].isdigit() and int(fields["processor"]) in allowed:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return max(1, len(cores) or len(allowed))


def default_threads(cores: int, load: float | None) -> int:
    """One thread per physical core not kept busy by other jobs: ``cores`` minus the whole runnable jobs of the
    1-minute ``load`` average (None where the OS has none), at least one. On an idle machine every core; where the
    load average counts a whole host rather than this container, at worst one thread."""
    busy = int(load) if load is not None and load >= 0 else 0
    return max(1, cores - busy)


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return None


def _threads(args, device: torch.device) -> int:
    """Set torch's CPU thread count for the demo; returns it."""
    asked = getattr(args, "threads", None)
    if asked is None and device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        asked = default_threads(physical_cores(), _load())
    if asked:
        torch.set_num_threads(int(asked))
    return torch.get_num_threads()


def _paths_phrase(rows: list[dict], branch: str) -> str:
    """'23 linears on cublas-int8, 8 in bf16 (6 unquantized top-level layer, 2 protected in checkpoint ...)'."""
    mine = [r for r in rows if r["model"] == branch]
    parts = []
    for path in dict.fromkeys(r["path"] for r in mine):
        group = [r for r in mine if r["path"] == path]
        n = sum(r["layers"] for r in group)
        if path == kernels.PATH_BF16:
            why = ", ".join(f"{r['layers']} {r['reason']}" for r in group)
            parts.append(f"{n} in bf16 ({why})")
        else:
            parts.append(f"{n} linears on {path}")
    return ", ".join(parts)


def _write_preview(path: pathlib.Path, lat_w8, lat_ref, rows, fidelity, rel_latent, cfg, preset, seed, device):
    quant = sorted({r["path"] for r in rows if r["path"] != kernels.PATH_BF16})
    reasons = sorted({r["reason"] for r in rows if r["path"] in quant and r["reason"] != "fastest path"})
    why = f" ({'; '.join(reasons)})" if reasons else " (the fused kernel)"
    w8_img, ref_img = latents_to_rgb([lat_w8, lat_ref])
    diff_img = difference_to_rgb(lat_w8, lat_ref, gain=DIFF_GAIN)
    cos_lat = fidelity[LATENT_KEY]
    panels = [
        (
            "W8A8 INT8",
            f"int8 weights and activations; GEMM path {'/'.join(quant)}{why}. "
            f"Per branch: {_paths_phrase(rows, 'conditional')}.",
            w8_img,
        ),
        ("bf16 reference", "the same model with float (bf16) linears: what W8A8 should reproduce.", ref_img),
        (
            f"difference x{DIFF_GAIN:g}",
            f"|W8A8 - bf16| per pixel, {DIFF_GAIN:g}x amplified (white = 1/{DIFF_GAIN:g} "
            f"of the reference's range). Cosine {cos_lat:.5f}, relative L2 {rel_latent:.4f}.",
            diff_img,
        ),
    ]
    title = f"Ideogram 4 W8A8 demo: {cfg.num_layers}-block tiny model, preset {preset.name}, seed {seed}, {device.type}"
    notes = (
        "Latent previews (no VAE: the first 3 principal components of the 32 latent channels, one projection "
        "for both). The model has seeded random weights, so it draws colour noise, not a picture: what matters "
        "is that the W8A8 panel matches the bf16 one."
    )
    fwd = " · ".join(f"{k.split(' forward')[0]} {v:.5f}" for k, v in fidelity.items() if "forward: W8A8" in k)
    verdict = "passes" if all(v >= FIDELITY_MIN for v in fidelity.values()) else "FAILS"
    footer = (
        f"Fidelity (cosine similarity, 1 = identical; >= {FIDELITY_MIN} {verdict}): sampled latent "
        f"{cos_lat:.5f}; one forward pass, W8A8 vs bf16: {fwd}."
    )
    return save_labelled_preview(path, panels, title, notes, footer)


def _quantized_paths(rows: list[dict]) -> list[str]:
    """The GEMM paths the quantized linears of ``rows`` take (bf16 layers left out), fastest first."""
    return sorted({r["path"] for r in rows if r["path"] != kernels.PATH_BF16}, key=kernels.PATHS.index)


class _OutputError(Exception):
    """A file of the demo could not be written (the message names it and why)."""


def _writing(what: pathlib.Path, write):
    """``write()``, an OSError turned into one line that names the file (a folder the OS refuses: /proc, /sys, a full
    disk)."""
    try:
        return write()
    except OSError as exc:
        raise _OutputError(f"cannot write {str(what)!r}: {exc.strerror or exc}") from None


def run_demo(args) -> int:
    try:
        return _run_demo(args)
    except _OutputError as exc:
        raise SystemExit(f"demo: --out: {exc}") from None


def _run_demo(args) -> int:
    t_start = time.perf_counter()
    out = pathlib.Path(getattr(args, "out", None) or "demo_out")
    seed = int(getattr(args, "seed", 0) or 0)
    preset = get_preset(getattr(args, "preset", None) or "Turbo 12")
    device = _device(getattr(args, "device", None))
    threads = _threads(args, device)
    dtype = torch.bfloat16
    cfg = Ideogram4Config.demo()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"demo: --out {str(out)!r}: cannot make the folder: {exc.strerror or exc}") from None
    print(
        f"Ideogram 4 W8A8 demo: {cfg.num_layers}-block model (emb {cfg.emb_dim}, {cfg.num_heads} heads), "
        f"preset {preset.name}, {DEMO_SIZE}x{DEMO_SIZE} px, seed {seed}, device {device}, "
        f"{threads} CPU thread(s)"
    )

    # 1-2. embedded model -> W8A8 file
    weights = {b: RandomWeights(cfg, s).materialize() for b, s in MODEL_SEEDS.items()}
    path = out / "ideogram4-demo-w8a8.safetensors"
    ckpt = _writing(path, lambda: write_w8a8(path, weights, cfg))
    print(f"wrote {ckpt} ({ckpt.stat().st_size / 1e6:.1f} MB, both branches, W8A8 + protected bf16 layers)")

    # 3. load through the real reader, build W8A8 and float models
    model_notes.forget()
    w8, ref = {}, {}
    for branch in MODEL_SEEDS:
        sd = read_branch(ckpt, branch, device=device, dtype=dtype)
        w8[branch] = Ideogram4DiT.from_state_dict(sd, w8a8_linears(), dtype=dtype, device=device, label=branch)
        w8[branch].declare_paths()
        ref[branch] = Ideogram4DiT(
            cfg, float_linears(dtype=dtype), state_dict=weights[branch], dtype=dtype, device=device
        )
    w8_paths = _quantized_paths(path_table(list(MODEL_SEEDS)))
    # the phantom-INT8 path (dequantize, float matmul) for comparison, where W8A8 itself runs another path: on a CPU
    # that measured the dequantized matmul faster it is the path W8A8 runs, and a second row would repeat the first
    dq = {}
    if w8_paths != [kernels.PATH_DEQUANT]:
        for branch in MODEL_SEEDS:
            sd = read_branch(ckpt, branch, device=device, dtype=dtype)
            dq[branch] = Ideogram4DiT.from_state_dict(
                sd, dequant_linears(), dtype=dtype, device=device, label=f"dequant-{branch[:6]}"
            )

    g = torch.Generator("cpu").manual_seed(1234)
    context = torch.randn(1, TEXT_TOKENS, cfg.llm_features_dim, generator=g).to(device)
    noise = make_noise(seed, DEMO_SIZE, DEMO_SIZE, channels=cfg.in_channels, device=device)

    # single-forward fidelity at the first sigma, per branch and the path that ran
    sigma0 = preset.sigmas(DEMO_SIZE, DEMO_SIZE)[:1].to(device)
    fidelity = {}
    with torch.no_grad():
        for branch, ctx in (("conditional", context), ("unconditional", None)):
            x0 = noise * sigma0
            r = ref[branch](x0, sigma0, context=ctx).float()
            ran = "/".join(_quantized_paths(path_table([branch])))
            fidelity[f"{branch} forward: W8A8 ({ran}) vs bf16"] = _cos(w8[branch](x0, sigma0, context=ctx).float(), r)
            if branch in dq:
                phantom = dq[branch](x0, sigma0, context=ctx).float()
                ran = "/".join(_quantized_paths(path_table([f"dequant-{branch[:6]}"])))
                fidelity[f"{branch} forward: phantom INT8 ({ran}) vs bf16"] = _cos(phantom, r)

        # 4. sample through the W8A8 path, then the float reference with the same noise
        def run(pair):
            return sample(
                pair["conditional"],
                pair["unconditional"],
                context,
                width=DEMO_SIZE,
                height=DEMO_SIZE,
                preset=preset,
                noise=noise,
            )

        t0 = time.perf_counter()
        lat_w8 = run(w8)
        t_w8 = time.perf_counter() - t0
        lat_ref = run(ref)
    fidelity[LATENT_KEY] = _cos(lat_w8, lat_ref)
    rel_latent = _rel(lat_w8, lat_ref)

    # 5. outputs
    rows = path_table(list(MODEL_SEEDS))
    png = out / "demo_preview.png"
    _writing(
        png,
        lambda: _write_preview(png, lat_w8[0], lat_ref[0], rows, fidelity, rel_latent, cfg, preset, seed, device),
    )
    _print_table(rows)
    _print_fidelity(fidelity, rel_latent)
    ok = all(v >= FIDELITY_MIN for v in fidelity.values())
    summary = {
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "preset": preset.name,
        "seed": seed,
        "size": [DEMO_SIZE, DEMO_SIZE],
        "threads": threads,
        "config": json.loads(cfg.to_json()),
        "checkpoint": str(ckpt),
        "preview": str(png),
        "gemm_paths": rows,
        "fidelity": fidelity,
        "latent_rel_err": rel_latent,
        "w8a8_sampling_seconds": t_w8,
        # the demo itself, and the whole process (Python's start and loading torch included; None off Linux)
        "demo_seconds": time.perf_counter() - t_start,
        "process_seconds": seconds_since_process_start(),
        "ok": ok,
        "environment": kernels.environment_report(),
    }
    summary_file = out / "demo_summary.json"
    _writing(summary_file, lambda: summary_file.write_text(json.dumps(summary, indent=2)))
    print(
        f"\npreview: {png}  (left: W8A8 via {'/'.join(_quantized_paths(rows))}, middle: bf16 reference, "
        f"right: their difference x{DIFF_GAIN:g})"
    )
    print(f"summary: {summary_file}")
    print(
        f"{_times(t_w8, summary['demo_seconds'], summary['process_seconds'])} — "
        + ("fidelity OK" if ok else f"FIDELITY BELOW {FIDELITY_MIN}")
    )
    return 0 if ok else 1


def _times(sampling: float, demo: float, process: float | None) -> str:
    """'W8A8 sampling <t> s; <t> s since the process started (<t> s in the demo, the rest starting Python and
    loading torch)': what each figure covers, so the last one is the wall time a user sees."""
    text = f"W8A8 sampling {sampling:.1f} s"
    if process is None:
        return f"{text}; the demo {demo:.1f} s (starting Python and loading torch not counted)"
    return (
        f"{text}; {process:.1f} s since the process started ({demo:.1f} s in the demo, the rest starting Python and "
        "loading torch)"
    )
