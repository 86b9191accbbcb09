"""End-to-end benchmark at full size: one sampling step and a full Default-20 sample at 1024x1024.

`python -m comfyui_ideogram4_int8.bench.e2e [--paths ...] [--out FILE] [--png FILE]`

Both CFG branches of the full 9.3B-per-branch Ideogram 4 DiT are built on the GPU from seeded
synthetic weights with outlier channels (``ideogram4.synthetic.RandomWeights``; no file I/O).
The conditional pass sees 512 text tokens + 4096 image tokens, the unconditional pass the 4096
image tokens only. Paths (each a whole model, same weights, same seed):

  bf16          every linear a bf16 F.linear (cuBLAS)
  fp8           the six block linears as FP8 e4m3 with per-tensor scales, dynamic per-tensor
                activation scale, torch._scaled_mm — how ComfyUI runs its fp8_scaled files on
                Hopper; other linears bf16
  dequant-bf16  W8A8 weights, 'phantom INT8': dequantize + bf16 matmul
  cublas-int8   W8A8 weights, torch._int_mm + epilogue
  triton-int8   W8A8 weights, the pack's fused path (FFN gate/up as one GEMM with SwiGLU fused)
The W8A8 models keep ``feed_forward.w2`` of every odd block in bf16 (17 protected layers, as
in the published W8A8 file) unless --no-protected.

``--smooth``: the W8A8 models are built the way the transformerlab file is laid out, a distinct SmoothQuant
vector on every quantized linear (``synthetic.smooth_vectors(names=...)``; w1 and w3 differ), the in-memory state
``read_branch`` would return (``synthetic.w8a8_state``), through ``Ideogram4DiT.from_state_dict``: with the fold
(``--fold on``, the default: divides folded into norms / scales at load, w1/w3 on one shared vector
``--gate-up``), without it (``--fold off``: every smoothed layer divides at run time, w1/w3 stay two GEMMs), or
both in one run (``--fold both``; paths labelled "<path> smooth folded" / "<path> smooth unfolded"), or both plus
the W8A8 model without any smoothing vector (``--fold all``, paths unlabelled as before).

``--compile default,max-autotune-no-cudagraphs``: after each path's eager numbers, the same path with both branches
under ``torch.compile`` (inductor) in each mode, labelled "<path> compiled:<mode>": the first step's wall time
(tracing, code generation, autotuning) as ``compile_s``, its ratio to the eager path, and its ratios to bf16 / fp8
compiled the same way.

Per path: median step time (both branches + CFG + Euler), GEMM / attention / other split from
the torch profiler, peak VRAM (weights of both branches + activations), a full Default-20 sample
time, and the sampled latent's cosine against bf16's. Writes JSON and a PNG plot.

The JSON has the shape of ``bench/report.py``: ``{"info": {...}, "runs": {label: entry}}``.
  info   gpu, torch, triton, date, command, layers, size, text_tokens, protected_bf16_layers_per_branch; with
         --smooth: smooth (vectors, gate_up, fold, fold_<on|off>_summary)
  runs   a path's label ("<path>", "<path> smooth folded|unfolded", each "... compiled:<mode>"): gemm_path,
         dividing_quantizer_passes_per_step, fused_gate_up_blocks, step_ms_median, step_ms_all, sm_mhz_median,
         watts_median, profile_ms ({gemm, act-quant, attention, other}), kernels and profile (one step's kernel
         table, ``bench/kernel_table.py``), peak_gib, weights_gib, default20_sample_ms, default20_host_s,
         layers_per_path; latent_cosine_vs_bf16, step_speedup_vs_bf16 / _fp8, sample_speedup_vs_bf16 / _fp8
         (against the path compiled alike); compiled runs: compiled, compile_s, speedup_vs_eager; a compiled run
         that failed: compiled, error
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import sys
import time

import torch
import torch.nn as nn

from .report import print_runs, run_info
from .timing import ClockWatch

PATHS = ("bf16", "fp8", "dequant-bf16", "cublas-int8", "triton-int8")
# --compile: torch.compile settings per mode name (each branch compiled as a whole module)
COMPILE_MODES = {"default": {}, "max-autotune-no-cudagraphs": {"mode": "max-autotune-no-cudagraphs"}}
WIDTH = HEIGHT = 1024
TEXT_TOKENS = 512


class LazyStateDict:
    """The minimal dict interface Ideogram4DiT(consume=True) uses, generating tensors on demand."""

    def __init__(self, weights) -> None:
        self._w = weights
        self._keys = set(weights)

    def __contains__(self, key):
        return key in self._keys

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._w[key]

    def pop(self, key, *default):
        if key not in self._keys:
            if default:
                return default[0]
            raise KeyError(key)
        self._keys.discard(key)
        return self._w[key]

    def __len__(self):
        return len(self._keys)

    def keys(self):
        return set(self._keys)

    def __iter__(self):
        return iter(sorted(self._keys))


class FP8Linear(nn.Module):
    """FP8 e4m3 weight with a per-tensor scale; activation scaled per tensor at run time."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.float()
        scale = w.abs().amax().clamp_min(1e-12) / 448.0
        self.register_buffer("weight", (w / scale).to(torch.float8_e4m3fn).contiguous())
        self.register_buffer("w_scale", scale.reshape(()).float())
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))
        self.out_features, self.in_features = weight.shape

    def forward(self, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        xs = (x2.abs().amax().float().clamp_min(1e-12) / 448.0).reshape(())
        x8 = (x2 / xs.to(x2.dtype)).clamp(-448, 448).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(
            x8, self.weight.t(), scale_a=xs, scale_b=self.w_scale, bias=self.bias, out_dtype=torch.bfloat16
        )
        return y.reshape(*lead, self.out_features)


FP8_LAYERS = ("attention.qkv", "attention.o", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")


def fp8_linears(dtype=torch.bfloat16):
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import float_linears

    floats = float_linears(dtype=dtype)

    def build(spec, entries):
        if entries is not None and spec.name.startswith("layers.") and spec.name.endswith(FP8_LAYERS):
            return FP8Linear(entries["weight"], entries.get("bias"))
        return floats(spec, entries)

    return build


def build_branch(config, seed, factory, label):
    from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
    from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights

    weights = RandomWeights(config, seed=seed, device="cuda", dtype=torch.float32)
    model = Ideogram4DiT(
        config,
        factory,
        state_dict=LazyStateDict(weights),
        dtype=torch.bfloat16,
        device="cuda",
        label=label,
        consume=True,
    )
    return model.eval()


def build_branch_smooth(config, seed, label, protected, fold: bool, gate_up: str):
    """One W8A8 branch in the transformerlab layout (a SmoothQuant vector on every quantized linear), built from
    the in-memory state read_branch returns, folded at build (``fold``) or not."""
    from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
    from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, smooth_vectors, w8a8_state
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_linears

    weights = RandomWeights(config, seed=seed, device="cuda", dtype=torch.float32)
    names = set(config.linear_names()) - set(protected)
    vectors = smooth_vectors(weights, config, names=names, seed=seed)
    state = w8a8_state(
        weights, config, smooth=vectors, quantized=names, protected=protected, dtype=torch.bfloat16, device="cuda"
    )
    del vectors
    model = Ideogram4DiT.from_state_dict(
        state,
        w8a8_linears(dtype=torch.bfloat16),
        config=config,
        dtype=torch.bfloat16,
        device="cuda",
        label=label,
        consume=True,
        fold_smooth=fold,
        gate_up=gate_up,
    )
    return model.eval()


def set_w8a8_path(models, path, fuse_gate_up):
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import W8A8Linear

    for m in models:
        for mod in m.modules():
            if isinstance(mod, W8A8Linear):
                mod.path = path
        if hasattr(m, "fuse_gate_up"):
            m.fuse_gate_up(fuse_gate_up and path == "triton-int8")


def classify(name: str) -> str:
    n = name.lower()
    if "quantize_rows" in n:
        return "act-quant"
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa", "attn")):
        return "attention"
    if any(s in n for s in ("gemm", "_w8a8", "xmma", "nvjet", "cutlass", "scaled_mm", "matmul", "wgmma", "sm90_")):
        return "gemm"
    return "other"


def profile_step(step_fn) -> tuple[dict[str, float], dict]:
    """(GPU time per kind, per-kernel table: ``kernel_table.table``) of one step."""
    from torch.profiler import ProfilerActivity, profile

    from .kernel_table import events, table

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step_fn()
        torch.cuda.synchronize()
    split: dict[str, float] = {"gemm": 0.0, "act-quant": 0.0, "attention": 0.0, "other": 0.0}
    for name, _, us in events(prof):  # the raw names: classify reads numbers in them (sm90_...)
        split[classify(name)] += us / 1e3
    return split, table(prof)


def time_steps(step_fn, warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        step_fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step_fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def run(args) -> dict:
    from comfyui_ideogram4_int8 import kernels
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
    from comfyui_ideogram4_int8.ideogram4.sampler import sample
    from comfyui_ideogram4_int8.ideogram4.schedule import get_preset
    from comfyui_ideogram4_int8.ideogram4.synthetic import default_protected
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import float_linears, w8a8_linears
    from comfyui_ideogram4_int8.kernels.dispatch import QUANT_DIVIDE

    config = Ideogram4Config.full()
    if args.layers:
        import dataclasses

        config = dataclasses.replace(config, num_layers=args.layers)
    g = torch.Generator(device="cuda").manual_seed(1234)
    context = torch.randn(1, TEXT_TOKENS, config.llm_features_dim, device="cuda", generator=g).bfloat16()
    preset = get_preset("Default 20")
    sig = preset.sigmas(WIDTH, HEIGHT)
    x0 = torch.randn(1, 128, HEIGHT // 16, WIDTH // 16, device="cuda", generator=g) * float(sig[0])
    sigma = torch.full((1,), float(sig[3]), device="cuda")
    protected = set() if args.no_protected else set(default_protected(config))

    def step(cond, uncond, gw=7.0):
        out = cond(x0, sigma, context=context).float()
        out_u = uncond(x0, sigma, context=None).float()
        v = gw * out + (1.0 - gw) * out_u
        return x0 + (float(sig[4]) - float(sig[3])) * v

    def measure(cond, uncond, path, label, weights_gib):
        """One path's numbers: step times, profiler split, peak memory, a Default-20 sample and its latent."""
        kernels.REGISTRY.clear()
        with torch.inference_mode():
            torch.cuda.reset_peak_memory_stats()
            with ClockWatch() as watch:  # the clock the steps ran at (a compiled run is denser: power limit)
                times = time_steps(lambda c=cond, u=uncond: step(c, u), args.warmup, args.reps)
            peak = torch.cuda.max_memory_allocated() / 2**30
            split, kernel_rows = profile_step(lambda c=cond, u=uncond: step(c, u))
            t_s = time.perf_counter()
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            lat = sample(cond, uncond, context, width=WIDTH, height=HEIGHT, preset="Default 20", seed=7)
            b.record()
            b.synchronize()
            sample_ms = a.elapsed_time(b)
            host_s = time.perf_counter() - t_s
            before = kernels.REGISTRY.launches[QUANT_DIVIDE]
            step(cond, uncond)  # one more step, counting the quantizer passes that divide by a smoothing vector
            divides_per_step = kernels.REGISTRY.launches[QUANT_DIVIDE] - before
        counts = {}
        for branch in ("conditional", "unconditional"):
            counts[branch] = kernels.REGISTRY.counts(branch)
        med = sorted(times)[len(times) // 2]
        fused = sum(
            getattr(layer.feed_forward, "gate_up", None) is not None
            for m in (cond, uncond)
            for layer in getattr(m, "layers", [])
        )
        entry = {
            "gemm_path": path,
            "dividing_quantizer_passes_per_step": divides_per_step,
            "fused_gate_up_blocks": fused,
            "step_ms_median": med,
            "step_ms_all": times,
            "sm_mhz_median": watch.sm_mhz,
            "watts_median": watch.watts,
            "profile_ms": split,
            "kernels": kernel_rows,  # per kernel, one step (bench/kernel_table.py compares two runs)
            "profile": {"step_calls": 1},  # which steps the table covers (kernel_table.coverage)
            "peak_gib": peak,
            "weights_gib": weights_gib,
            "default20_sample_ms": sample_ms,
            "default20_host_s": host_s,
            "layers_per_path": counts,
        }
        print(
            f"[{label}] step {med:.1f} ms, peak {peak:.2f} GiB, Default-20 {sample_ms / 1e3:.2f} s, "
            f"split { ({k: round(v, 1) for k, v in split.items()}) }, SM {watch.sm_mhz} MHz, {watch.watts} W",
            flush=True,
        )
        return entry, lat.float().cpu()

    result = {
        "info": run_info(
            "e2e",
            layers=config.num_layers,
            size=f"{WIDTH}x{HEIGHT}",
            text_tokens=TEXT_TOKENS,
            protected_bf16_layers_per_branch=len(protected),
        ),
        "runs": {},
    }
    latents = {}
    groups = []
    wanted = [p for p in PATHS if p in args.paths]
    if "bf16" in wanted:
        groups.append(("bf16", lambda: float_linears(dtype=torch.bfloat16), ["bf16"]))
    if "fp8" in wanted:
        groups.append(("fp8", fp8_linears, ["fp8"]))
    w8 = [p for p in wanted if p in ("dequant-bf16", "cublas-int8", "triton-int8")]
    if w8 and (not args.smooth or args.fold == "all"):
        groups.append(("w8a8", lambda: w8a8_linears(quantize=lambda n: n not in protected, dtype=torch.bfloat16), w8))
    if w8 and args.smooth:
        folds = {"on": (True,), "off": (False,), "both": (True, False), "all": (True, False)}[args.fold]
        for fold in folds:
            tag = "smooth folded" if fold else "smooth unfolded"
            result["info"].setdefault(
                "smooth",
                {
                    "vectors": "a distinct SmoothQuant vector on every quantized linear (w1/w3 different)",
                    "gate_up": args.gate_up,
                    "fold": args.fold,
                },
            )
            groups.append((f"w8a8 {tag}", ("smooth", fold), [(p, f"{p} {tag}") for p in w8]))

    for group, make_factory, paths in groups:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        if isinstance(make_factory, tuple):  # ("smooth", fold): the transformerlab layout, folded or not
            fold = make_factory[1]
            cond = build_branch_smooth(config, 1, "conditional", protected, fold, args.gate_up)
            uncond = build_branch_smooth(config, 2, "unconditional", protected, fold, args.gate_up)
            result["info"]["smooth"][f"fold_{'on' if fold else 'off'}_summary"] = cond.smoothing.summary_lines()
        else:
            cond = build_branch(config, 1, make_factory(), "conditional")
            uncond = build_branch(config, 2, make_factory(), "unconditional")
        torch.cuda.synchronize()
        build_s = time.perf_counter() - t0
        weights_gib = torch.cuda.memory_allocated() / 2**30
        print(f"[{group}] built both branches in {build_s:.1f}s, {weights_gib:.2f} GiB resident", flush=True)
        for entry in paths:
            path, label = entry if isinstance(entry, tuple) else (entry, entry)
            if group.startswith("w8a8"):
                set_w8a8_path((cond, uncond), path, not args.no_fuse_gate_up)
            result["runs"][label], latents[label] = measure(cond, uncond, path, label, weights_gib)
            for mode in args.compile:
                # each branch compiled as a whole, the way ComfyUI's TorchCompileModel compiles a diffusion model
                name = f"{label} compiled:{mode}"
                torch._dynamo.reset()
                compiled = tuple(torch.compile(m, **COMPILE_MODES[mode]) for m in (cond, uncond))
                try:
                    t_c = time.perf_counter()
                    with torch.inference_mode():
                        step(*compiled)  # tracing and code generation of both branches (Triton autotuning included)
                    torch.cuda.synchronize()
                    compile_s = time.perf_counter() - t_c
                    result["runs"][name], latents[name] = measure(*compiled, path, name, weights_gib)
                    result["runs"][name].update(
                        compiled=mode,
                        compile_s=round(compile_s, 1),
                        speedup_vs_eager=result["runs"][label]["step_ms_median"]
                        / result["runs"][name]["step_ms_median"],
                    )
                except Exception as exc:  # noqa: BLE001 - a compile failure is a result; the other paths still run
                    latents.pop(name, None)
                    result["runs"][name] = {"compiled": mode, "error": f"{type(exc).__name__}: {exc}"[:600]}
                    print(f"[{name}] FAILED {result['runs'][name]['error']}", flush=True)
                finally:
                    del compiled
                    torch._dynamo.reset()
        del cond, uncond
    ref = latents.get("bf16")
    for path, lat in latents.items():
        entry = result["runs"][path]
        if ref is not None:
            entry["latent_cosine_vs_bf16"] = torch.nn.functional.cosine_similarity(
                lat.flatten().double(), ref.flatten().double(), dim=0
            ).item()
        mode = entry.get("compiled")
        suffix = f" compiled:{mode}" if mode else ""  # a compiled path against its peers compiled the same way
        bf = result["runs"].get("bf16" + suffix)
        if bf:
            entry["step_speedup_vs_bf16"] = bf["step_ms_median"] / entry["step_ms_median"]
            entry["sample_speedup_vs_bf16"] = bf["default20_sample_ms"] / entry["default20_sample_ms"]
        fp8 = result["runs"].get("fp8" + suffix)
        if fp8:
            entry["step_speedup_vs_fp8"] = fp8["step_ms_median"] / entry["step_ms_median"]
            entry["sample_speedup_vs_fp8"] = fp8["default20_sample_ms"] / entry["default20_sample_ms"]
    return result


def print_table(result):
    info = result["info"]

    def row(e):
        p = e["profile_ms"]
        return (
            f"{e['step_ms_median']:>9.1f}{e.get('step_speedup_vs_bf16', 0):>7.2f}x"
            f"{e.get('step_speedup_vs_fp8', 0):>6.2f}x{e['default20_sample_ms'] / 1e3:>8.2f}{p['gemm']:>8.1f}"
            f"{p['act-quant']:>7.1f}{p['attention']:>7.1f}{p['other']:>7.1f}{e['peak_gib']:>10.2f}"
            f"{e.get('latent_cosine_vs_bf16', float('nan')):>8.4f}"
        )

    print_runs(
        f"{info['gpu']}, torch {info['torch']}, triton {info['triton']}, {info['layers']} blocks, {info['size']}, "
        f"{info['text_tokens']} text tokens",
        ("path", 30),
        f"{'step ms':>9}{'x bf16':>8}{'x fp8':>7}{'D20 s':>8}{'gemm':>8}{'quant':>7}{'attn':>7}{'other':>7}"
        f"{'peak GiB':>10}{'cos':>8}",
        result["runs"],
        row,
    )


def plot(result, png: pathlib.Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    paths = [p for p, e in result["runs"].items() if "error" not in e]
    parts = ("gemm", "act-quant", "attention", "other")
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(paths)
    for part in parts:
        vals = [result["runs"][p]["profile_ms"][part] for p in paths]
        ax.bar(paths, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for i, p in enumerate(paths):
        ax.text(i, bottom[i], f"{result['runs'][p]['step_ms_median']:.0f} ms", ha="center", va="bottom")
    ax.set_ylabel("GPU time per sampling step (ms, profiler)")
    ax.set_title(f"Ideogram 4 full size, 1024x1024, both CFG branches — {result['info']['gpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m comfyui_ideogram4_int8.bench.e2e")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--png", default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=None, help="fewer blocks (smoke runs only)")
    ap.add_argument("--no-protected", action="store_true", help="quantize every block linear")
    ap.add_argument("--no-fuse-gate-up", action="store_true", help="run w1 and w3 as two GEMMs")
    ap.add_argument(
        "--smooth",
        action="store_true",
        help="W8A8 models in the transformerlab layout: a distinct SmoothQuant vector on every quantized "
        "linear (w1/w3 different)",
    )
    ap.add_argument(
        "--fold",
        choices=("on", "off", "both", "all"),
        default="on",
        help="with --smooth: fold the divides at load (on, the default), keep them at run time (off), "
        "time both in one run (both), or both plus the W8A8 model without smoothing vectors (all)",
    )
    ap.add_argument(
        "--gate-up",
        default=None,
        help="with --smooth and the fold: w1/w3 mode (ideogram4.smooth_fold.GATE_UP_MODES; default "
        "its DEFAULT_GATE_UP)",
    )
    ap.add_argument(
        "--compile", default="", help=f"comma list of {list(COMPILE_MODES)}: also time each path compiled that way"
    )
    args = ap.parse_args(argv)
    args.paths = args.paths.split(",")
    args.compile = [m for m in args.compile.split(",") if m]
    bad = [m for m in args.compile if m not in COMPILE_MODES]
    if bad:
        ap.error(f"--compile {','.join(bad)}: choose from {list(COMPILE_MODES)}")
    from comfyui_ideogram4_int8.ideogram4 import smooth_fold

    args.gate_up = args.gate_up or smooth_fold.DEFAULT_GATE_UP
    if args.gate_up not in smooth_fold.GATE_UP_MODES:
        ap.error(f"--gate-up {args.gate_up!r}: choose one of {list(smooth_fold.GATE_UP_MODES)}")
    if not torch.cuda.is_available():
        print("the end-to-end benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    result = run(args)
    slug = result["info"]["gpu"].replace(" ", "-")
    out = pathlib.Path(args.out or f"bench/results/e2e-{slug}-{result['info']['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    plot(result, pathlib.Path(args.png) if args.png else out.with_suffix(".png"))
    print_table(result)
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
