"""Where programmatic dependent launch (quantizer -> Gluon GEMM) wins or loses time.

For a few shapes and PDL variants (off; GEMM waits only; GEMM also prefetches weight tiles; the
same without the quantizer's early trigger) prints per linear: CUDA-graph replay time, eager
back-to-back time, and from a profiler trace of eager calls the mean quantizer and GEMM kernel
durations and the span from quantizer start to GEMM end.
Usage: python bench/diag_pdl.py [shape ...]   (log to stdout; JSON to $OUT/diag_pdl.json)"""

from __future__ import annotations

import json
import os
import sys

import torch
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.bench.gemm import SHAPES
from comfyui_ideogram4_int8.bench.timing import graph_ms
from comfyui_ideogram4_int8.kernels import quant_triton

VARIANTS = {  # label: (IDEOGRAM4_INT8_PDL, quantizer trigger kept)
    "off": ("0", True),
    "wait": ("wait", True),
    "prefetch": ("1", True),
    "prefetch, no trigger": ("1", False),
}


def eager_ms(fn, calls=20, reps=5):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / calls)
    return best


def kernel_spans(fn, calls=10):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    evs = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0),
        key=lambda e: e.time_range.start,
    )
    quant = [e for e in evs if "quantize" in e.name]
    gemm = [e for e in evs if "w8a8" in e.name or "gemm" in e.name.lower()]
    spans = []
    for qe in quant:
        nxt = next((g for g in gemm if g.time_range.end > qe.time_range.start), None)
        if nxt is not None:
            spans.append(nxt.time_range.end - qe.time_range.start)

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "quant_us": mean([e.time_range.end - e.time_range.start for e in quant]),
        "gemm_us": mean([e.time_range.end - e.time_range.start for e in gemm]),
        "span_us": mean(spans),
        "kernels": sorted({e.name[:60] for e in evs}),
    }


def main():
    names = sys.argv[1:] or ["o", "qkv", "uncond_w2"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    orig = quant_triton.quantize_rows_triton
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for name in names:
        M, N, K = SHAPES[name]
        x = (torch.randn(M, K, device="cuda", generator=gen) * 0.5).bfloat16()
        w, ws = Kn.quantize_weight_ref(torch.randn(N, K, device="cuda", generator=gen) * 0.02)
        bias = torch.randn(N, device="cuda", generator=gen).bfloat16()

        def fn(x=x, w=w, ws=ws, bias=bias):
            return Kn.w8a8_linear(x, w, ws, bias, path="triton-int8")

        rows = {}
        for label, (env, trigger) in VARIANTS.items():
            os.environ["IDEOGRAM4_INT8_PDL"] = env
            if not trigger:
                quant_triton.quantize_rows_triton = lambda *a, **kw: orig(*a, **{**kw, "pdl_trigger": False})
            try:
                r = {"graph_us": graph_ms([fn], reps=7) * 1e3, "eager_us": eager_ms(fn) * 1e3}
                r.update(kernel_spans(fn))
            finally:
                quant_triton.quantize_rows_triton = orig
            rows[label] = r
            print(
                f"{name:10s} {label:22s} graph {r['graph_us']:7.1f}  eager {r['eager_us']:7.1f}  quant "
                f"{r['quant_us']:6.1f}  gemm {r['gemm_us']:6.1f}  quant-start..gemm-end {r['span_us']:7.1f} us",
                flush=True,
            )
        os.environ.pop("IDEOGRAM4_INT8_PDL", None)
        out["shapes"][name] = rows
        print("  kernels:", rows["off"]["kernels"])
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "diag_pdl.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
