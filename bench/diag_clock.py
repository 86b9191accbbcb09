"""SM clock and board power while one linear runs back to back, per path: is the W8A8 GEMM held by
the chip's power/clock limit rather than by its schedule?

    python bench/diag_clock.py sustain [shape ...]   # table + $OUT/diag_clock.json
    python bench/diag_clock.py once shape            # a few calls (a target for ncu)

``sustain``: ten calls per CUDA graph, replayed for ~2 s per (shape, path) while a thread polls
nvidia-smi (SM clock, power, clock-event reasons) every 50 ms; reports the median clock and power
over the polls taken after a 0.3 s settle, and the GPU time per call from the replays.
Paths: triton-int8 (the shipped pick) and bf16 F.linear of the same shape."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.bench.ab_linear import bf16_operands, operand_sets
from comfyui_ideogram4_int8.bench.gemm import SHAPES
from comfyui_ideogram4_int8.bench.timing import capture_graph

QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"


def _poll(stop: threading.Event, rows: list) -> None:
    while not stop.is_set():
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout.strip()  # fmt: skip
            clk, pw, why = [x.strip() for x in out.splitlines()[0].split(",")]
            rows.append((time.time(), float(clk), float(pw), why))
        except Exception as exc:  # a missing field on an old driver: record and go on
            rows.append((time.time(), float("nan"), float("nan"), f"poll failed: {exc}"))
        time.sleep(0.05)


def sustain(name: str, path: str, seconds: float = 2.0) -> dict:
    M, N, K = SHAPES[name]
    sets = operand_sets(M, N, K, torch.Generator(device="cuda").manual_seed(0))
    if path == "bf16":
        fns = [lambda a=a: F.linear(*a) for a in bf16_operands(sets)]
    else:
        fns = [lambda st=st: Kn.w8a8_linear(*st, path=path) for st in sets]
    g = capture_graph(fns)
    rows, stop = [], threading.Event()
    th = threading.Thread(target=_poll, args=(stop, rows), daemon=True)
    th.start()
    t0 = time.time()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 0
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(20):
            g.replay()
        reps += 20
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    stop.set()
    th.join()
    ok = [r for r in rows if r[0] - t0 > 0.3 and r[1] == r[1]]
    return {
        "shape": name,
        "path": path,
        "us_per_call": start.elapsed_time(end) * 1e3 / (reps * 10),
        "sm_mhz_median": statistics.median(r[1] for r in ok) if ok else None,
        "sm_mhz_min": min((r[1] for r in ok), default=None),
        "power_w_median": statistics.median(r[2] for r in ok) if ok else None,
        "reasons": sorted({r[3] for r in ok}),
        "polls": len(ok),
    }


def main(argv) -> int:
    mode = argv[0] if argv else "sustain"
    if mode == "once":
        M, N, K = SHAPES[argv[1]]
        sets = operand_sets(M, N, K, torch.Generator(device="cuda").manual_seed(0))
        for _ in range(3):
            Kn.w8a8_linear(*sets[0], path="triton-int8")
        torch.cuda.synchronize()
        return 0
    names = argv[1:] or ["llm_cond_proj", "qkv"]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    import triton

    res["triton"] = triton.__version__
    for name in names:
        for path in ("triton-int8", "bf16"):
            r = sustain(name, path)
            res["rows"].append(r)
            print(json.dumps(r), flush=True)
    print(f"\n{res['gpu']}  torch {res['torch']}  triton {res['triton']}")
    print(f"{'shape':<16}{'path':<13}{'us/call':>9}{'SM MHz':>8}{'min':>6}{'W':>6}  reasons")
    for r in res["rows"]:
        print(f"{r['shape']:<16}{r['path']:<13}{r['us_per_call']:>9.1f}{r['sm_mhz_median'] or 0:>8.0f}"
              f"{r['sm_mhz_min'] or 0:>6.0f}{r['power_w_median'] or 0:>6.0f}  {','.join(r['reasons'])}")  # fmt: skip
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "diag_clock.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
