"""Where a whole W8A8 linear's GPU time goes, kernel by kernel, for each pinned tile config.

For each config of ab_linear.CANDIDATES[shape] (or the shipped pick): ten calls captured in one
CUDA graph, replayed under torch.profiler; prints per call the time of each kernel (quantizer,
GEMM, split-K reduce, memset) and their sum.
Usage: python bench/prof_linear.py [shape ...]   (JSON to $OUT/prof_linear.json)"""

from __future__ import annotations

import collections
import json
import os
import sys

import torch
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.bench.ab_linear import CANDIDATES, operand_sets
from comfyui_ideogram4_int8.bench.gemm import SHAPES
from comfyui_ideogram4_int8.bench.timing import capture_graph
from comfyui_ideogram4_int8.kernels import autotune

CALLS, REPLAYS = 10, 5


def kernel_us(cfg, sets) -> dict[str, float]:
    """{kernel name: GPU us per linear call} for ``cfg`` pinned (None: the picker's choice)."""
    shipped_pick = autotune.PICKER.pick
    if cfg is not None:
        autotune.PICKER.pick = lambda *a, **kw: (cfg, "prof pin")
    try:
        graph = capture_graph([lambda st=st: Kn.w8a8_linear(*st, path="triton-int8") for st in sets], CALLS)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(REPLAYS):
                graph.replay()
            torch.cuda.synchronize()
    finally:
        autotune.PICKER.pick = shipped_pick
    per = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:60]] += ev.device_time_total / (CALLS * REPLAYS)
    return dict(per)


def main():
    names = sys.argv[1:] or ["llm_cond_proj"]
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for name in names:
        M, N, K = SHAPES[name]
        sets = operand_sets(M, N, K, torch.Generator(device="cuda").manual_seed(0))
        result["shapes"][name] = {}
        for cfg in CANDIDATES.get(name, [None]):
            label = "shipped" if cfg is None else cfg.key()
            per = kernel_us(cfg, sets)
            result["shapes"][name][label] = per
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
            print(f"{name} {label}: total {sum(per.values()):.1f} us = {parts}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "prof_linear.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
