"""Projected step and image time of the pack on consumer cards, from the committed H200 measurements.

    python -m comfyui_ideogram4_int8.bench.projection [--inputs FILE] [--steps 20] [--json]

Projections, not measurements: docs/projection.md has the formula's reasoning, its sources and the table this prints.
Each class of one 1024x1024 step's kernels, timed on the H200 (the committed kernel table), is moved to a card by
the rate the card does that class's work at, assuming the card reaches the fraction of its peak the H200 reached:

    t_class(card) = work_class / (peak_class(card) * eta_class)
    eta_class     = work_class / (t_class(H200) * peak_class(H200))

* ``int8_gemm``: INT8 ops of the W8A8 linears, at the dense INT8 rate;
* ``protected_gemm``: FLOPs of the 17 protected w2 per branch, at the BF16 rate (bf16, the default) or the FP8 rate
  (fp8), both with FP32 accumulation;
* ``attention``: FLOPs of QK^T and PV, at the BF16 rate with FP32 accumulation;
* ``memory``: the rest of the step (norms, the quantizer, q/k RoPE, elementwise work), at the DRAM bandwidth
  (t_card = t_H200 * bandwidth_H200 / bandwidth_card).

Streaming: a card too small for both branches copies ``streamed_gib_per_step`` per step over its bus. The copies
overlap compute (measured so on the H200), so they hide when they take no longer than the compute, and the step is the
longer of the two; the image is ``--steps`` such steps (sampling only: text encoding and VAE decode not included).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

from .report import markdown_table

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_INPUTS = pathlib.Path(__file__).with_name("projection_inputs.json")
CLASSES = ("int8_gemm", "protected_gemm", "attention")  # the rest of the step is ``memory``
GIB = 2**30


# -- the committed measurements --------------------------------------------------------------------------------------


def read_kernel_table(text: str) -> tuple[dict[str, float], list[tuple[str, dict[str, float]]]]:
    """({column: ms of kernels per step}, [(kernel, {"A": ms, "B": ms})]) of a bench/kernel_table.py comparison."""
    totals = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^([AB]) = .*?: ([\d.]+) ms of kernels per step", text, re.M)
    }
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("kernel ") and "A ms" in line:
            inside = True
            continue
        if inside:
            fields = line.split()
            if not fields:
                break
            name = line.rsplit(None, 5)[0].strip()
            rows.append((name, {"A": float(fields[-4]), "B": float(fields[-2])}))
    return totals, rows


def class_ms(run: dict, totals: dict, rows: list) -> dict[str, float]:
    """ms per step of each class of one run: its terms summed (["A" | "B" | "-A" | "-B", kernel prefix]: that kernel's
    time in that column, negated with "-"), ``memory`` the rest of the run's column."""
    out = {}
    for name, terms in run["classes"].items():
        total = 0.0
        for column, prefix in terms:
            hits = [ms for kernel, ms in rows if kernel.startswith(prefix)]
            if len(hits) != 1:
                raise ValueError(f"kernel {prefix!r}: {len(hits)} rows of the kernel table start with it; expected 1")
            total += -hits[0][column[-1]] if column.startswith("-") else hits[0][column]
        out[name] = total
    out["memory"] = totals[run["column"]] - sum(out.values())
    return out


def work(model: dict) -> dict[str, float]:
    """Operations per step of each compute class (2 per multiply-add) from the model's shapes (``model`` of the
    inputs)."""
    blocks, protected, emb, qkv, ffn = (model[k] for k in ("blocks", "protected_w2", "emb", "qkv", "ffn"))
    tokens = sum(model["tokens"])
    per_token = blocks * emb * (qkv + emb + 2 * ffn) + (blocks - protected) * ffn * emb
    return {
        "int8_gemm": 2.0 * (tokens * per_token + model["text_tokens"] * emb * model["llm_features"]),
        "protected_gemm": 2.0 * tokens * protected * ffn * emb,
        "attention": 4.0 * blocks * emb * sum(n * n for n in model["tokens"]),
    }


# -- the projection --------------------------------------------------------------------------------------------------


def card_peaks(card: dict, rates: dict) -> dict[str, float | None]:
    """A card's dense rates (ops / s) from its architecture's per-SM rates, SM count and boost clock."""
    per_sm = rates[card["arch"]]
    clock = card["sms"] * card["boost_mhz"] * 1e6
    return {k: None if per_sm[k] is None else per_sm[k] * clock for k in ("int8", "fp8", "bf16")}


def _rate(peaks: dict, cls: str, fmt: str) -> float:
    if cls == "int8_gemm":
        return peaks["int8"]
    if cls == "protected_gemm" and fmt == "fp8":
        return peaks["fp8"]
    return peaks["bf16"]


def project(inputs: dict, root: pathlib.Path = ROOT, steps: int = 20) -> list[dict]:
    """One row per (card, protected-layer format): the H200's measured rows first, then each card's projection."""
    totals, rows = read_kernel_table((root / inputs["kernel_table"]).read_text())
    ops = work(inputs["model"])
    ref = inputs["reference"]
    ref_peaks = {"int8": ref["int8_tops"] * 1e12, "fp8": ref["fp8_tflops"] * 1e12, "bf16": ref["bf16_tflops"] * 1e12}
    out = []
    for fmt, run in inputs["runs"].items():
        measured = class_ms(run, totals, rows)
        eta = {c: ops[c] / (measured[c] * 1e-3 * _rate(ref_peaks, c, fmt)) for c in CLASSES}
        out.append(_row(ref["name"] + ", measured", fmt, measured, None, None, steps, eta))
        for card in inputs["cards"]:
            peaks = card_peaks(card, inputs["rates_per_sm_clock"])
            if fmt == "fp8" and peaks["fp8"] is None:
                continue  # no fp8 tensor cores: protected layers stay bf16
            ms = {c: ops[c] / (_rate(peaks, c, fmt) * eta[c]) * 1e3 for c in CLASSES}
            ms["memory"] = measured["memory"] * ref["dram_gbs"] / card["dram_gbs"]
            gib = inputs["streamed_gib_per_step"][fmt][str(card["vram_gb"])][0]
            out.append(_row(card["name"], fmt, ms, gib, card["bus_gbs"], steps, eta))
    return out


def _row(name, fmt, ms, gib, bus_gbs, steps, eta) -> dict:
    compute = sum(ms.values())
    bus_ms = gib * GIB / (bus_gbs * 1e9) * 1e3 if gib else 0.0
    step = max(compute, bus_ms)
    return {
        "card": name,
        "protected": fmt,
        "ms": {k: round(v, 1) for k, v in ms.items()},
        "compute_ms": round(compute, 1),
        "streamed_gib": gib,
        "bus_ms": round(bus_ms, 1),
        "streaming_hides": None if not gib else bus_ms <= compute,
        "step_ms": round(step, 1),
        "image_s": round(step * steps / 1e3, 1),
        "eta": {k: round(v, 3) for k, v in eta.items()},
    }


def table(rows: list[dict], steps: int) -> str:
    head = ("card", "protected", "INT8 GEMM", "protected GEMM", "attention", "rest", "compute ms", "streamed GiB")
    head += ("bus ms", "hides", "step ms", f"{steps}-step image s")

    def cells(r):
        hides = "-" if r["streaming_hides"] is None else "yes" if r["streaming_hides"] else "**no**"
        gib = "-" if r["streamed_gib"] is None else f"{r['streamed_gib']:.2f}"
        classes = [f"{r['ms'][c]:.0f}" for c in (*CLASSES, "memory")]
        streaming = [f"{r['compute_ms']:.0f}", gib, f"{r['bus_ms']:.0f}", hides]  # does the bus hide behind compute
        return [r["card"], r["protected"], *classes, *streaming, f"{r['step_ms']:.0f}", f"{r['image_s']:.1f}"]

    numbers = {*range(2, 9), 10, 11}  # every column but card, protected and hides
    return "\n".join(markdown_table(head, [cells(r) for r in rows], right=numbers))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--inputs", default=str(DEFAULT_INPUTS), help="the inputs JSON (default: bench/projection_inputs.json)"
    )
    ap.add_argument("--steps", type=int, default=20, help="sampling steps per image (default: 20, the Default preset)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    inputs = json.loads(pathlib.Path(args.inputs).read_text())
    rows = project(inputs, steps=args.steps)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    measured = [r for r in rows if r["streamed_gib"] is None]
    eta = "; ".join(f"{r['protected']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["eta"].items()) for r in measured)
    print(f"PROJECTIONS, not measurements: 1024x1024, both branches per step ({inputs['kernel_table']})")
    print(f"H200 fraction of peak per class (eta), which every card is assumed to reach: {eta}\n")
    print(table(rows, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
