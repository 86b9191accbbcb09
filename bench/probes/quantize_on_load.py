"""Wall time of quantize-on-load on the CPU, per layer shape of Ideogram 4, against the twin's torch ops.

    python -m comfyui_ideogram4_int8.bench.probes.quantize_on_load [--shapes qkv,w2] [--reps 3] [--threads N]
        [--out FILE]

A bf16 or fp8 Ideogram 4 file (ComfyUI's fp8_scaled: e4m3 codes with one scale per layer) is quantized to W8A8 on
load, on the CPU, by the loader and the Patch node: 9.3B weights per branch. For each distinct shape of the layers
quantized by default (``Ideogram4Config.default_quantized``) it times, median of ``--reps``:
  pack   ``formats.quantize_on_load.quantize_weight`` (what read_branch runs)
  twin   ``kernels.quantize_weight_ref(weight.float() * scale)``: the same arithmetic as plain torch ops in one
         pass over the layer (quantize-on-load ran these ops before, on chunks of up to 256 MiB of float32)
and checks that both give the same bits (scales by their bit patterns). ``w2-fp8`` is the loader's
``protected_layers = fp8`` conversion of a bf16 w2 (``quantize_fp8_tensorwise``) against its formula. The branch
line sums count x median over the branch's layers of each source kind (per-layer medians, not one timed load).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import torch

from ... import kernels
from ...ideogram4.config import Ideogram4Config
from ...ideogram4.formats.quantize_on_load import quantize_fp8_tensorwise, quantize_weight
from ...ideogram4.synthetic import default_protected
from ..report import markdown_table


def _shapes(config: Ideogram4Config) -> dict[str, tuple[int, int, int]]:
    """short name -> (N, K, layers per branch) of the layers quantized on load by default."""
    quantized = config.default_quantized()
    out: dict[str, list] = {}
    for spec in config.linears():
        if spec.name not in quantized:
            continue
        short = spec.name.rsplit(".", 1)[-1] if spec.name.startswith("layers.") else spec.name
        entry = out.setdefault(short, [spec.out_features, spec.in_features, 0])
        entry[2] += 1
    return {k: tuple(v) for k, v in out.items()}


def _median_s(fn, reps: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(reps):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
        if _ < reps - 1:
            del result
    return statistics.median(times), result


def _source(kind: str, n: int, k: int, gen: torch.Generator):
    w = torch.randn(n, k, generator=gen) * 0.02
    w[:, :: max(1, k // 7)] *= 30  # outlier input channels
    if kind == "bf16":
        return w.to(torch.bfloat16), None
    scale = w.abs().amax() / 448
    return (w / scale).to(torch.float8_e4m3fn), scale.reshape(())


def _scaled(w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    return w.float() * scale if scale is not None else w.float()


def run(shape_names: list[str] | None, reps: int) -> dict:
    config = Ideogram4Config()
    shapes = _shapes(config)
    if shape_names:
        unknown = sorted(set(shape_names) - set(shapes) - {"w2-fp8"})
        if unknown:
            raise SystemExit(f"--shapes: unknown {unknown}; pick from {sorted(shapes)} and w2-fp8")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, (n, k, count) in shapes.items():
        if shape_names and name not in shape_names:
            continue
        for kind in ("fp8", "bf16"):
            w, scale = _source(kind, n, k, gen)
            pack_s, got = _median_s(lambda w=w, scale=scale: quantize_weight(w, scale), reps)
            twin_s, want = _median_s(lambda w=w, scale=scale: kernels.quantize_weight_ref(_scaled(w, scale)), reps)
            same = torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))
            rows.append(dict(layer=name, source=kind, n=n, k=k, count=count, pack_s=pack_s, twin_s=twin_s, same=same))
            del w, got, want
    if not shape_names or "w2-fp8" in shape_names:
        n, k, count = shapes["w2"]
        w, _ = _source("bf16", n, k, gen)
        pack_s, got = _median_s(lambda: quantize_fp8_tensorwise(w), reps)

        def formula():
            wf = w.float()
            s = wf.abs().amax() / kernels.reference.FP8_MAX
            return (wf / s).to(torch.float8_e4m3fn), s

        twin_s, want = _median_s(formula, reps)
        same = torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
        same = same and torch.equal(got[1].reshape(1).view(torch.int32), want[1].reshape(1).view(torch.int32))
        protected = len(default_protected(config))  # the W8A8 file's bf16 w2 (what protected_layers = fp8 converts)
        rows.append(
            dict(layer="w2-fp8", source="bf16", n=n, k=k, count=protected, pack_s=pack_s, twin_s=twin_s, same=same)
        )
    branch = {}
    for kind in ("fp8", "bf16"):
        mine = [r for r in rows if r["source"] == kind and r["layer"] != "w2-fp8"]
        if len(mine) == len(shapes):
            branch[kind] = {
                "pack_s": sum(r["count"] * r["pack_s"] for r in mine),
                "twin_s": sum(r["count"] * r["twin_s"] for r in mine),
            }
    return {
        "date": datetime.date.today().isoformat(),
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "reps": reps,
        "rows": rows,
        "branch": branch,
    }


def table(result: dict) -> str:
    def cells(r):
        pack, twin = r["pack_s"], r["twin_s"]
        times = [f"{pack * 1e3:.0f}", f"{twin * 1e3:.0f}", f"{twin / pack:.2f}"]
        return [r["layer"], r["source"], f"{r['n']} x {r['k']}", r["count"], *times, "yes" if r["same"] else "NO"]

    head = ("layer", "source", "N x K", "per branch", "pack ms", "twin ms", "twin / pack", "same bits")
    lines = [
        f"quantize-on-load on the CPU ({result['cpu_count']} cores, torch {result['torch']}, "
        f"{result['torch_threads']} threads), median of {result['reps']}",
        *markdown_table(head, [cells(r) for r in result["rows"]]),
    ]
    for kind, b in result["branch"].items():
        lines.append(
            f"one branch from {kind}: pack {b['pack_s']:.1f} s, twin {b['twin_s']:.1f} s "
            f"({b['twin_s'] / b['pack_s']:.2f}x; sum of per-layer medians)"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", help="comma-separated: qkv,o,w1,w2,w3,adaln_modulation,llm_cond_proj,w2-fp8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args.shapes.split(",") if args.shapes else None, args.reps)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(result))
    return 0 if all(r["same"] for r in result["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
