"""A/B of GEMM tile configs in interleaved rounds (GPU time, CUDA-graph replay, with bias).

`bench --tune` times each config once, in sequence, and moves +-10% between runs; this re-ranks the
top candidates with every config measured in each of several rounds, so drift hits all alike.
Usage: python bench/ab_tiles.py [shape ...]   (prints a ranking per shape; JSON to $OUT/ab_tiles.json)"""

from __future__ import annotations

import json
import os
import sys

import torch
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.bench.gemm import SHAPES
from comfyui_ideogram4_int8.bench.timing import graph_ms, rank_interleaved
from comfyui_ideogram4_int8.kernels.configs import CONFIG_SPACES, GemmConfig
from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm

# every Gluon config of the sm90 space, and the Triton persistent kernel for reference
CANDIDATES = [c for c in CONFIG_SPACES["sm90"] if c.gluon] + [GemmConfig(128, 256, 128, 8, 1, 8, 3, 1, 0, 1)]


def _gemm_ms(cfg, sets) -> float:
    """GPU ms of one GEMM launch with ``cfg``, rotating over the operand sets."""
    return graph_ms([lambda st=st: launch_gemm(st[0], st[1], cfg, st[2], st[3], st[4], st[5]) for st in sets], reps=5)


def main():
    names = sys.argv[1:] or ["qkv", "o", "w1/w3", "w2", "uncond_qkv", "uncond_o", "uncond_w1/w3", "uncond_w2"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for name in names:
        M, N, K = SHAPES[name]
        sets = []
        for _ in range(2):
            x = (torch.randn(M, K, device="cuda", generator=gen) * 0.5).bfloat16()
            q, s = Kn.quantize_per_token(x)
            w, ws = Kn.quantize_weight_ref(torch.randn(N, K, device="cuda", generator=gen) * 0.02)
            sets.append((q, w, s, ws.float().contiguous(), torch.randn(N, device="cuda", generator=gen),
                         torch.empty(M, N, device="cuda", dtype=torch.bfloat16)))

        ranked = rank_interleaved({c.key(): (lambda c=c, sets=sets: _gemm_ms(c, sets)) for c in CANDIDATES})
        flop = 2.0 * M * N * K
        print(f"{name} ({M}x{N}x{K}): " + ", ".join(f"{k} {ms:.3f} ({flop / ms / 1e9:.0f})" for ms, k in ranked[:4]),
              flush=True)
        result["shapes"][name] = ranked
        del sets
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "ab_tiles.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
