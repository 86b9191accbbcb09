"""w1 / w3 with different SmoothQuant vectors: the error of each way to fold them, against float64.

`python -m comfyui_ideogram4_int8.bench.probes.smooth_gate_up [--tokens 512] [--seeds 3] [--out FILE]`

One norm (ffn_norm1) feeds both FFN projections, so only one vector can be folded into it. The transformerlab file
gives w1 and w3 their own (s1, s3). The ways out (``ideogram4.smooth_fold.GATE_UP_MODES``), each run through the
pack's own code (``fold_smoothing``, ``W8A8Linear``, ``kernels.swiglu_w8a8_pair``) on the CPU:

  stored     as the file is: each projection divides its input by its own vector at run time (no fold)
  ratio      s1 folded into ffn_norm1; w3 divides by s3 / s1 at run time (two quantizer passes)
  geo / max / min / w1   one shared vector (sqrt(s1 s3), max, min = SmoothQuant of [w1; w3], or s1); the int8
             weights re-quantized to it (a second rounding of each re-quantized weight); one quantizer pass and
             the fused SwiGLU GEMM

Data, per seed: one block's float weights from the repo's generator (``synthetic.RandomWeights`` at the full
Ideogram 4 widths: E = 4608, F = 12288; ffn_norm1's weight carries the outlier channels), a residual stream with
outlier channels of its own and per-token scales, an adaLN scale per channel; the activation x = ffn_norm1(h) ·
(1 + scale) in bf16 as the model makes it. SmoothQuant vectors as transformerlab's alpha = 0.5 would make them:
s = sqrt(amax_x / amax_w) per input channel, amax_x from calibration tokens, evaluated on fresh tokens.
Two weight scenarios: "generator" (as the generator makes them) and "w3 column outliers" (1/64 of w3's input
columns x8: vectors that differ a lot, as real gate and up weights can).

Reference: float64 with the true (unquantized) weights and the float64 activation. Reported per variant: relative
Frobenius error (and cosine) of gate, up, h = silu(gate)·up and the FFN output h W2^T (true W2, float64), with
gate / up / h computed
  "quant":  in float32 from each variant's GEMMs (the quantization choices alone), and
  "as run": as the model runs them (stored / ratio: two bf16 linears and a bf16 SwiGLU; shared: one fused SwiGLU
            GEMM whose epilogue works in float32).
Also weight-level: relative error of the dequantized W1, W3 against the float ones.
No timing: a CPU run of numerics (the GPU runs the same functions, bit for bit on the integer side).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

from ..report import shown_args

MODES = ("stored", "ratio", "geo", "max", "min", "w1")
SCENARIOS = ("generator", "w3 column outliers")


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm()).item()


def _cos(a: torch.Tensor, ref: torch.Tensor) -> float:
    return F.cosine_similarity(a.double().flatten(), ref.double().flatten(), dim=0).item()


def _residual(n: int, e: int, g: torch.Generator, outlier_idx: torch.Tensor) -> torch.Tensor:
    """A residual stream: per-token scale (log-normal), a few channels 8x larger than the rest."""
    h = torch.randn(n, e, generator=g) * torch.exp(0.5 * torch.randn(n, 1, generator=g))
    h[:, outlier_idx] *= 8.0
    return h


def _activation(h: torch.Tensor, norm_w: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """ffn_norm1(h) * (1 + scale_mlp) as the model computes it (in ``dtype``)."""
    x = F.rms_norm(h.to(dtype), (h.shape[-1],), norm_w.to(dtype), 1e-5)
    return x * (1.0 + scale).to(dtype)


def run_seed(seed: int, scenario: str, tokens: int, calib: int, device: str) -> dict:
    from comfyui_ideogram4_int8 import kernels
    from comfyui_ideogram4_int8.ideogram4 import smooth_fold
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
    from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, smoothquant_vector
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import W8A8Linear, dequantize_entries

    full = Ideogram4Config.full()
    cfg = dataclasses.replace(full, num_layers=1)
    rw = RandomWeights(cfg, seed=seed)
    p = "layers.0."
    w1, w3, w2 = (rw[p + f"feed_forward.{n}.weight"].to(device) for n in ("w1", "w3", "w2"))
    norm_w = rw[p + "ffn_norm1.weight"].to(device)
    e = cfg.emb_dim
    g = torch.Generator().manual_seed(seed * 7919 + 1)
    if scenario == "w3 column outliers":
        cols = torch.randperm(e, generator=g)[: e // 64].to(device)
        w3 = w3.clone()
        w3[:, cols] *= 8.0
    resid_outliers = torch.randperm(e, generator=g)[: max(1, e // 256)]
    scale = 0.3 * torch.randn(e, generator=g)
    h_cal = _residual(calib, e, g, resid_outliers).to(device)
    h_ev = _residual(tokens, e, g, resid_outliers).to(device)
    scale = scale.to(device)

    # SmoothQuant vectors from the calibration activations (alpha = 0.5), the file's int8 weights
    amax_x = _activation(h_cal.double(), norm_w.double(), scale.double(), torch.float64).abs().amax(0).float()
    s1, s3 = smoothquant_vector(w1, amax_x), smoothquant_vector(w3, amax_x)
    state = {p + "ffn_norm1.weight": norm_w.bfloat16()}
    for name, w, s in (("w1", w1, s1), ("w3", w3, s3)):
        q, ws = kernels.quantize_weight_ref(w, s)
        state.update(
            {
                f"{p}feed_forward.{name}.weight": q,
                f"{p}feed_forward.{name}.weight_scale": ws,
                f"{p}feed_forward.{name}.input_smooth": s.float(),
            }
        )

    # float64 reference (true weights, float64 activation)
    x_ref = _activation(h_ev.double(), norm_w.double(), scale.double(), torch.float64)
    g_ref = x_ref @ w1.double().T
    u_ref = x_ref @ w3.double().T
    hh_ref = F.silu(g_ref) * u_ref
    y_ref = hh_ref @ w2.double().T
    out = {
        "seed": seed,
        "scenario": scenario,
        "tokens": tokens,
        "s3_over_s1": {
            "median": (s3 / s1).median().item(),
            "min": (s3 / s1).min().item(),
            "max": (s3 / s1).max().item(),
        },
        "variants": {},
    }

    # the bf16 weights with the bf16 activation: the floor any 8-bit variant sits above
    x_bf = _activation(h_ev, norm_w, scale, torch.bfloat16)
    gb = F.linear(x_bf, w1.bfloat16()).float()
    ub = F.linear(x_bf, w3.bfloat16()).float()
    out["bf16_weights"] = {"h": _rel(F.silu(gb) * ub, hh_ref), "gate": _rel(gb, g_ref)}
    del gb, ub

    for mode in MODES:
        st = dict(state)
        t0 = time.perf_counter()
        rep = smooth_fold.fold_smoothing(st, cfg, gate_up="off" if mode == "stored" else mode)
        fold_s = time.perf_counter() - t0
        ents = {}
        for name in ("w1", "w3"):
            m = f"{p}feed_forward.{name}"
            ents[name] = {
                k: st[f"{m}.{k}"]
                for k in ("weight", "weight_scale", "input_smooth", "input_folded")
                if f"{m}.{k}" in st
            }
        lin = {n: W8A8Linear.from_entries(ents[n]) for n in ("w1", "w3")}
        x = _activation(h_ev, st[p + "ffn_norm1.weight"], scale, torch.bfloat16)
        # quantization alone: float32 outputs of each projection's GEMM
        gq = kernels.w8a8_linear(
            x, lin["w1"].weight, lin["w1"].weight_scale, None, lin["w1"].input_divisor, out_dtype=torch.float32
        )
        uq = kernels.w8a8_linear(
            x, lin["w3"].weight, lin["w3"].weight_scale, None, lin["w3"].input_divisor, out_dtype=torch.float32
        )
        hq = F.silu(gq.double()) * uq.double()
        # as the model runs it
        same_input = (lin["w1"].input_divisor is None) == (lin["w3"].input_divisor is None) and (
            lin["w1"].input_divisor is None or torch.equal(lin["w1"].input_divisor, lin["w3"].input_divisor)
        )
        if same_input:
            h_run = kernels.swiglu_w8a8_pair(
                x,
                lin["w1"].weight,
                lin["w1"].weight_scale,
                lin["w3"].weight,
                lin["w3"].weight_scale,
                smooth=lin["w1"].input_divisor,
            )
            run_how = "one fused SwiGLU GEMM (float32 epilogue), one quantizer pass"
        else:
            h_run = F.silu(lin["w1"](x)) * lin["w3"](x)
            run_how = "two bf16 linears + bf16 SwiGLU, two quantizer passes"
        divides = [n for n in ("w1", "w3") if lin[n].input_divisor is not None]
        out["variants"][mode] = {
            "runs_as": run_how,
            "quantizer_passes": 1 if same_input else 2,
            "quantizer_passes_dividing": 1 if same_input and divides else len(divides),
            "requantized": [f.name.rsplit(".", 1)[-1] for f in rep.layers.values() if f.requantized],
            "fold_seconds": fold_s,
            "weight_err": {
                n: _rel(dequantize_entries({**ents[n], "input_folded": None}), w) for n, w in (("w1", w1), ("w3", w3))
            },
            "quant": {
                "gate": _rel(gq, g_ref),
                "up": _rel(uq, u_ref),
                "h": _rel(hq, hh_ref),
                "ffn_out": _rel(hq @ w2.double().T, y_ref),
                "h_cos": _cos(hq, hh_ref),
            },
            "as_run": {
                "h": _rel(h_run, hh_ref),
                "ffn_out": _rel(h_run.double() @ w2.double().T, y_ref),
                "h_cos": _cos(h_run, hh_ref),
            },
        }
        del gq, uq, hq, h_run, lin, st
    return out


def run_model(seed: int, scenario: str) -> dict:
    """Whole DiT (demo config: 4 blocks, bf16 compute), every mode, output relative error against the float32 model
    of the true weights; smoothing vectors for qkv / w1 / w3 / llm_cond_proj as the synthetic writer makes them."""
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
    from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
    from comfyui_ideogram4_int8.ideogram4.synthetic import RandomWeights, w8a8_state
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import float_linears, w8a8_linears

    cfg = Ideogram4Config.demo()
    weights = RandomWeights(cfg, seed=seed).materialize()
    g = torch.Generator().manual_seed(seed)
    if scenario == "w3 column outliers":
        for i in range(cfg.num_layers):
            cols = torch.randperm(cfg.emb_dim, generator=g)[: max(1, cfg.emb_dim // 64)]
            weights[f"layers.{i}.feed_forward.w3.weight"][:, cols] *= 8.0
    ref = Ideogram4DiT(cfg, float_linears(dtype=torch.float32), state_dict=dict(weights), dtype=torch.float32)
    x = torch.randn(2, cfg.in_channels, 8, 8, generator=g)
    ctx = torch.randn(2, 16, cfg.llm_features_dim, generator=g)
    sigma = torch.tensor([0.3, 0.8])
    with torch.no_grad():
        want = ref(x, sigma, context=ctx).double()
    state = w8a8_state(weights, cfg, dtype=torch.bfloat16)
    out = {"seed": seed, "scenario": scenario}
    for mode in MODES:
        kw = {"fold_smooth": False} if mode == "stored" else {"gate_up": mode}
        model = Ideogram4DiT.from_state_dict(state, w8a8_linears(), config=cfg, dtype=torch.bfloat16, **kw)
        if mode != "ratio":
            model.fuse_gate_up()  # as the fused path runs it where w1 and w3 share their input
        with torch.no_grad():
            out[mode] = _rel(model(x, sigma, context=ctx), want)
    return out


def summarize(results: list[dict]) -> dict:
    """Mean over seeds per scenario and mode, and each mode's error relative to 'stored'."""
    summary: dict = {}
    for scen in SCENARIOS:
        rows = [r for r in results if r["scenario"] == scen]
        if not rows:
            continue
        per = {}
        for mode in MODES:
            vals = [r["variants"][mode] for r in rows]

            def mean(get, vals=vals):
                return sum(get(v) for v in vals) / len(vals)

            per[mode] = {
                "quant_h": mean(lambda v: v["quant"]["h"]),
                "quant_ffn_out": mean(lambda v: v["quant"]["ffn_out"]),
                "as_run_h": mean(lambda v: v["as_run"]["h"]),
                "as_run_ffn_out": mean(lambda v: v["as_run"]["ffn_out"]),
                "weight_err_w1": mean(lambda v: v["weight_err"]["w1"]),
                "weight_err_w3": mean(lambda v: v["weight_err"]["w3"]),
                "worst_seed_quant_h_vs_stored": max(
                    v["quant"]["h"] / r["variants"]["stored"]["quant"]["h"] for v, r in zip(vals, rows, strict=True)
                ),
                "quantizer_passes": vals[0]["quantizer_passes"],
                "quantizer_passes_dividing": vals[0]["quantizer_passes_dividing"],
                "runs_as": vals[0]["runs_as"],
            }
        for mode in MODES:
            per[mode]["quant_h_vs_stored"] = per[mode]["quant_h"] / per["stored"]["quant_h"]
            per[mode]["as_run_h_vs_stored"] = per[mode]["as_run_h"] / per["stored"]["as_run_h"]
        summary[scen] = {
            "modes": per,
            "bf16_weights_h": sum(r["bf16_weights"]["h"] for r in rows) / len(rows),
            "s3_over_s1_range": [min(r["s3_over_s1"]["min"] for r in rows), max(r["s3_over_s1"]["max"] for r in rows)],
        }
    return summary


def print_table(summary: dict, file=sys.stdout) -> None:
    for scen, s in summary.items():
        lo, hi = s["s3_over_s1_range"]
        print(
            f"\n{scen}: s3/s1 in [{lo:.3f}, {hi:.3f}]; bf16 weights (no int8) h rel err {s['bf16_weights_h']:.2e}",
            file=file,
        )
        print(
            f"{'mode':<8}{'h (quant)':>11}{'x stored':>9}{'worst':>7}{'ffn out':>10}{'h (as run)':>12}"
            f"{'x stored':>9}{'W1 err':>9}{'W3 err':>9}  quantizer passes (dividing)",
            file=file,
        )
        for mode, m in s["modes"].items():
            print(
                f"{mode:<8}{m['quant_h']:>11.3e}{m['quant_h_vs_stored']:>8.3f}x{m['worst_seed_quant_h_vs_stored']:>6.3f}"
                f"{m['quant_ffn_out']:>10.3e}{m['as_run_h']:>12.3e}{m['as_run_h_vs_stored']:>8.3f}x"
                f"{m['weight_err_w1']:>9.2e}{m['weight_err_w3']:>9.2e}  {m['quantizer_passes']} "
                f"({m['quantizer_passes_dividing']})",
                file=file,
            )
        if "model" in s:
            base = s["model"]["stored"]
            print(
                f"whole DiT (demo config, bf16, {s['model_seeds']} seeds), output rel err vs float32: "
                + ", ".join(f"{k} {v:.3e} ({v / base:.3f}x)" for k, v in s["model"].items()),
                file=file,
            )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m comfyui_ideogram4_int8.bench.probes.smooth_gate_up")
    ap.add_argument("--tokens", type=int, default=512, help="evaluation tokens per seed")
    ap.add_argument("--calib", type=int, default=512, help="calibration tokens (SmoothQuant amax)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--model-seeds", type=int, default=6, help="seeds of the whole-model (demo config) comparison")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="JSON file (default bench/results/smooth-gate-up-<device>.json)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    results = []
    t0 = time.perf_counter()
    for scen in SCENARIOS:
        for seed in range(args.seeds):
            results.append(run_seed(1000 + seed, scen, args.tokens, args.calib, args.device))
            print(f"[{scen} seed {seed}] done at {time.perf_counter() - t0:.0f}s", flush=True)
    models = []
    for scen in SCENARIOS:
        for seed in range(args.model_seeds):
            models.append(run_model(2000 + seed, scen))
    summary = summarize(results)
    for scen in SCENARIOS:
        rows = [r for r in models if r["scenario"] == scen]
        if rows:
            summary[scen]["model"] = {m: sum(r[m] for r in rows) / len(rows) for m in MODES}
            summary[scen]["model_seeds"] = len(rows)
    info = {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "device": args.device,
        "command": "python -m comfyui_ideogram4_int8.bench.probes.smooth_gate_up " + shown_args(sys.argv[1:]),
        "widths": "E=4608, F=12288 (full Ideogram 4)",
        "seconds": time.perf_counter() - t0,
    }
    out = pathlib.Path(args.out or f"bench/results/smooth-gate-up-{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "summary": summary, "runs": results, "model_runs": models}, indent=1))
    print_table(summary)
    with out.with_suffix(".log").open("w") as fh:
        print(json.dumps(info), file=fh)
        print_table(summary, fh)
    print(f"\nresults: {out} (+ .log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
