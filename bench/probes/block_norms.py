"""The block norms' kernel (kernels/rms_modulate_triton.py) at Ideogram 4's width: launch shapes against the bus.

    python -m comfyui_ideogram4_int8.bench.probes.block_norms [--tokens 4608,4096] [--out FILE]

For each token count (4608: the conditional pass at 1024² with 512 text tokens; 4096: the unconditional one) it
times, as GPU time per call with the host out of the picture (``timing.graph_ms``: calls captured in a CUDA graph,
rotating over operand sets that together exceed the L2 cache):
  pre            the pre-norm, rms_norm(x) * (1 + scale)
  pre+quant      the same with its int8 handoff (the next linear's per-token quantization in the same pass)
  residual       the gated residual, x + tanh(gate) * rms_norm(y)
for every warp count in ``WARPS``, plus the pieces they replace or must beat:
torch's unfused ops (what ComfyUI's block runs), the activation quantizer alone, and a device copy of the same bytes
(the bandwidth ceiling). GB/s counts the bytes each kernel must move (bf16 reads and writes, int8 rows, scales).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

from ..timing import graph_ms

WIDTH = 4608
WARPS = (2, 4, 8, 16)
SETS = 4  # operand sets rotated through: 4 x 42 MB of activations per kernel, past the 50 MB L2


def _operands(tokens: int, width: int, device) -> list[dict]:
    g = torch.Generator(device="cpu").manual_seed(tokens)
    out = []
    for _ in range(SETS):
        x = (torch.randn(tokens, width, generator=g) * 2).bfloat16()
        x[:, 7] *= 60  # an outlier channel
        y = (torch.randn(tokens, width, generator=g) * 4).bfloat16()
        out.append(
            {
                "x": x.to(device),
                "y": y.to(device),
                "w": (torch.rand(width, generator=g) + 0.5).bfloat16().to(device),
                "scale": (1 + torch.randn(1, width, generator=g) * 0.5).bfloat16().to(device),
                "gate": torch.tanh(torch.randn(1, width, generator=g)).bfloat16().to(device),
            }
        )
    return out


def _timed(calls: list) -> float:
    return graph_ms(calls, calls=2 * len(calls), reps=15) * 1e3  # µs per call


def run(tokens_list: list[int], width: int = WIDTH, device: str = "cuda") -> dict:
    from ...kernels.quant_triton import quantize_rows_triton
    from ...kernels.rms_modulate_triton import rms_modulate_triton

    rows_out = []
    for tokens in tokens_list:
        ops = _operands(tokens, width, device)
        act = tokens * width * 2  # one bf16 activation
        int8_rows = act // 2 + 4 * tokens  # its int8 form and the float32 scales
        moved = {"pre": 2 * act, "pre+quant": 2 * act + int8_rows, "residual": 3 * act}
        cases = {
            "pre": lambda o, n=tokens, **k: rms_modulate_triton(o["x"], None, o["w"], o["scale"], n, 1e-5, **k),
            "pre+quant": lambda o, n=tokens, **k: rms_modulate_triton(
                o["x"], None, o["w"], o["scale"], n, 1e-5, True, **k
            ),
            "residual": lambda o, n=tokens, **k: rms_modulate_triton(o["y"], o["x"], o["w"], o["gate"], n, 1e-5, **k),
        }
        for case, fn in cases.items():
            for warps in WARPS:
                try:
                    us = _timed([lambda o=o, nw=warps, f=fn: f(o, num_warps=nw) for o in ops])
                except Exception as exc:  # noqa: BLE001 - a launch shape this Triton cannot build: reported
                    rows_out.append({"tokens": tokens, "case": case, "warps": warps, "error": repr(exc)})
                    continue
                rows_out.append(_row(tokens, case, f"fused kernel, {warps} warps", us, moved[case], warps))
        torch_ops = {
            "pre": lambda o: F.rms_norm(o["x"], (width,), o["w"], 1e-5) * o["scale"],
            "residual": lambda o: o["x"] + o["gate"] * F.rms_norm(o["y"], (width,), o["w"], 1e-5),
        }
        for case, fn in torch_ops.items():
            us = _timed([lambda o=o, f=fn: f(o) for o in ops])
            rows_out.append(_row(tokens, case, "torch unfused ops", us, moved[case]))
        us = _timed([lambda o=o: quantize_rows_triton(o["x"]) for o in ops])
        rows_out.append(_row(tokens, "quant", "the activation quantizer alone", us, act + int8_rows))
        bufs = [torch.empty_like(o["x"]) for o in ops]
        us = _timed([lambda o=o, b=b: b.copy_(o["x"]) for o, b in zip(ops, bufs, strict=True)])
        rows_out.append(_row(tokens, "copy", "device copy (bandwidth ceiling)", us, 2 * act))
    return {"rows": rows_out}


def _row(tokens, case, what, us, moved, warps=None) -> dict:
    return {
        "tokens": tokens,
        "case": case,
        "what": what,
        "warps": warps,
        "us": round(us, 2),
        "gb_s": round(moved / us / 1e3, 1),
    }


def print_table(result: dict) -> None:
    print(f"{'tokens':>6}  {'case':<10} {'what':<34} {'µs':>8} {'GB/s':>7}")
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['tokens']:>6}  {r['case']:<10} {r['warps']} warps: {r['error'][:60]}")
        else:
            print(f"{r['tokens']:>6}  {r['case']:<10} {r['what']:<34} {r['us']:>8.2f} {r['gb_s']:>7.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m comfyui_ideogram4_int8.bench.probes.block_norms", description=__doc__)
    ap.add_argument("--tokens", default="4608,4096", help="comma list of token counts")
    ap.add_argument("--out", default=None, help="JSON results file")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the block-norm benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    result = run([int(t) for t in a.tokens.split(",") if t])
    result["info"] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(result, indent=1))
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
