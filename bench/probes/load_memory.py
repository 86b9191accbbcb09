"""Peak GPU memory of loading one full-size Ideogram 4 branch (9.3B) from a W8A8 file.

    python -m comfyui_ideogram4_int8.bench.probes.load_memory [--dir /tmp] [--format w8a8] [--out FILE]

1. writes a synthetic full-size checkpoint (both branches, seeded random weights, SmoothQuant
   vectors, 17 protected bf16 feed_forward.w2 layers) with the streaming writer, layer by layer
   on the GPU (host RAM holds one layer);
2. in a fresh process (so host RSS counts loading only): ``read_branch(path, "conditional",
   device="cuda")`` + ``Ideogram4DiT.from_state_dict(..., w8a8_linears())``, and reports
   ``torch.cuda.max_memory_allocated()`` against the final model size and the largest layer;
3. optionally runs one small forward through the fused path (``--forward``).

The claim checked: peak <= final model size + the largest single layer. ``--format comfy-fp8``
measures quantize-on-load from a ComfyUI fp8_scaled file instead (one branch per file).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import resource
import subprocess
import sys
import time

import torch

from ..report import shown_args

MiB = 1024 * 1024


def _gpu_info() -> dict:
    import triton

    info = {
        "gpu": "cpu",
        "cc": None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        info.update(gpu=torch.cuda.get_device_name(), cc=f"{cc[0]}.{cc[1]}")
    return info


def write_file(directory: pathlib.Path, fmt: str, config_name: str, device: str) -> tuple[pathlib.Path, float]:
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
    from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, write_comfy_fp8, write_w8a8

    cfg = Ideogram4Config.full() if config_name == "full" else Ideogram4Config.demo()
    t0 = time.perf_counter()
    last = [0.0]

    def progress(done, total, key):
        if time.perf_counter() - last[0] > 10 or done == total:
            last[0] = time.perf_counter()
            print(f"  write {done}/{total} {key}", flush=True)

    if fmt == "w8a8":
        weights = {b: RandomWeights(cfg, s, device=device) for b, s in (("conditional", 1), ("unconditional", 2))}
        path = write_w8a8(
            directory / f"ideogram4-{config_name}-synthetic-w8a8.safetensors", weights, cfg, progress=progress
        )
    else:
        path = write_comfy_fp8(
            directory / f"ideogram4-{config_name}-synthetic-fp8.safetensors",
            RandomWeights(cfg, 1, device=device),
            cfg,
            progress=progress,
        )
    return path, time.perf_counter() - t0


class _Mem:
    """torch.cuda memory counters relative to a baseline; all None on the CPU (smoke runs)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.init()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated() if self.cuda else 0

    def now(self):
        if not self.cuda:
            return None
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - self.base

    def peak(self):
        return torch.cuda.max_memory_allocated() - self.base if self.cuda else None


def measure(path: pathlib.Path, branch: str, forward: bool, device: str = "cuda") -> dict:
    """Run in a fresh process: load one branch onto the device and account for every byte."""
    from comfyui_ideogram4_int8 import kernels
    from comfyui_ideogram4_int8.ideogram4.checkpoint import read_branch
    from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_linears

    dev = torch.device(device)
    mem = _Mem(dev)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    sd = read_branch(path, branch, device=dev, dtype=torch.bfloat16)
    after_read, peak_read = mem.now(), mem.peak()
    layer_bytes: dict[str, int] = {}
    for key, t in sd.items():
        module = key.rsplit(".", 1)[0]
        layer_bytes[module] = layer_bytes.get(module, 0) + t.numel() * t.element_size()
    model = Ideogram4DiT.from_state_dict(
        sd, w8a8_linears(), dtype=torch.bfloat16, device=dev, label=branch, consume=True
    )
    del sd
    final, peak = mem.now(), mem.peak()
    seconds = time.perf_counter() - t0
    model_bytes = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    largest = max(layer_bytes.items(), key=lambda kv: kv[1])
    out = {
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "branch": branch,
        "load_seconds": seconds,
        "model_bytes": model_bytes,
        "final_allocated": final,
        "peak_allocated": peak,
        "after_read_allocated": after_read,
        "peak_during_read": peak_read,
        "largest_layer": {"name": largest[0], "bytes": largest[1]},
        "overhead_bytes": None if peak is None else peak - final,
        "claim_holds": None if peak is None else peak - final <= largest[1],
        "device": str(dev),
        "host_max_rss_growth_bytes": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024,
        "quantized_layers": sum(1 for m in model.modules() if type(m).__name__ == "W8A8Linear"),
    }
    if forward:
        cfg = model.config
        g = torch.Generator("cpu").manual_seed(0)
        x = torch.randn(1, cfg.in_channels, 16, 16, generator=g).to(dev)
        ctx = torch.randn(1, 32, cfg.llm_features_dim, generator=g).to(dev)
        with torch.no_grad():
            y = model(x, torch.tensor([0.5], device=dev), context=ctx if branch == "conditional" else None)
        out["forward"] = {
            "finite": bool(torch.isfinite(y).all()),
            "paths": kernels.REGISTRY.counts(branch),
            "peak_allocated_with_forward": mem.peak(),
        }
    return out


def _table(r: dict) -> str:
    rows = [
        ("file on disk (both branches)", r["file_bytes"]),
        ("final model (params + buffers)", r["model_bytes"]),
        ("allocated after build", r["final_allocated"]),
        ("peak allocated while loading", r["peak_allocated"]),
        (f"largest layer ({r['largest_layer']['name']})", r["largest_layer"]["bytes"]),
        ("peak - final", r["overhead_bytes"]),
        ("host max-RSS growth", r["host_max_rss_growth_bytes"]),
    ]
    lines = [f"{'quantity':<52}{'MiB':>12}", "-" * 64]
    lines += [
        f"{name:<52}{value / MiB:>12.1f}" if value is not None else f"{name:<52}{'n/a':>12}" for name, value in rows
    ]
    verdict = {True: "HOLDS", False: "DOES NOT HOLD", None: "not measured (no GPU)"}[r["claim_holds"]]
    lines.append(f"peak <= final + largest layer: {verdict}   (load {r['load_seconds']:.1f} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m comfyui_ideogram4_int8.bench.probes.load_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dir", default="/tmp", help="where the synthetic checkpoint goes (~20 GB for w8a8)")
    p.add_argument("--format", choices=["w8a8", "comfy-fp8"], default="w8a8")
    p.add_argument("--config", choices=["full", "demo"], default="full", help="demo: a seconds-long smoke run")
    p.add_argument("--branch", choices=["conditional", "unconditional"], default="conditional")
    p.add_argument("--out", default=None, help="JSON result (default bench/results/load-memory-<gpu>-<date>.json)")
    p.add_argument("--keep", action="store_true", help="keep the synthetic checkpoint")
    p.add_argument("--forward", action="store_true", help="also run one small forward through the loaded model")
    p.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke run of the script)")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # internal: child process
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("load_memory measures GPU memory: it needs a CUDA GPU (or --device cpu for a smoke run)", file=sys.stderr)
        return 2
    if args.measure:
        print(json.dumps(measure(pathlib.Path(args.measure), args.branch, args.forward, args.device)))
        return 0
    info = _gpu_info()
    directory = pathlib.Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    print(f"writing a synthetic {args.config} {args.format} checkpoint to {directory} ...", flush=True)
    path, write_s = write_file(directory, args.format, args.config, args.device)
    print(f"  {path} ({path.stat().st_size / 1e9:.2f} GB) in {write_s:.0f} s", flush=True)
    try:
        cmd = [
            sys.executable,
            "-m",
            "comfyui_ideogram4_int8.bench.probes.load_memory",
            "--measure",
            str(path),
            "--branch",
            args.branch,
            "--device",
            args.device,
        ] + (["--forward"] if args.forward else [])
        child = subprocess.run(cmd, capture_output=True, text=True)
        if child.returncode != 0:
            print(child.stdout + child.stderr, file=sys.stderr)
            return child.returncode
        result = json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    result.update(
        info=info,
        format=args.format,
        config=args.config,
        write_seconds=write_s,
        command="python -m comfyui_ideogram4_int8.bench.probes.load_memory " + shown_args(sys.argv[1:]),
    )
    print(_table(result))
    if "forward" in result:
        print(f"forward: finite={result['forward']['finite']} paths={result['forward']['paths']}")
    slug = "".join(c if c.isalnum() else "-" for c in info["gpu"]).strip("-").lower()
    out = pathlib.Path(args.out or f"bench/results/load-memory-{args.format}-{slug}-{info['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"results: {out}")
    return 1 if result["claim_holds"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
