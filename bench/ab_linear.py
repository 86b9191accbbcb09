"""A/B of whole W8A8 linears (activation quant + GEMM) in interleaved rounds, one tile config
pinned at a time.

`ab_tiles.py` ranks GEMM-only launches; a whole linear can rank differently (the GEMM reads q
right after the quantizer wrote it: uncond_w2 ranks cooperative 128x256 first here, ping-pong
128x128 in GEMM-only runs). Every variant runs in each round, GPU time by CUDA-graph replay over
two operand sets, median of the rounds.
With ``--sustained SECONDS`` the variants (and bf16 F.linear, for the ratio) are instead timed under
sustained load (timing.sustained_ms: interleaved windows of back-to-back graph replays, the board at
its power cap as in a sampling loop), with the median SM clock of each.
Usage: python bench/ab_linear.py [--sustained SECONDS] [shape ...]   (JSON to $OUT/ab_linear.json)"""

from __future__ import annotations

import json
import os
import sys

import torch
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.bench.gemm import SHAPES
from comfyui_ideogram4_int8.bench.timing import graph_ms, rank_interleaved, sustained_ms
from comfyui_ideogram4_int8.kernels import autotune
from comfyui_ideogram4_int8.kernels.configs import G

PINGPONG = G(2, 128, 128, 5)
COOP = G(1, 128, 256, 4)
COOP_256x128 = G(1, 256, 128, 3)
CANDIDATES = {  # shape: configs to pin (None: whatever the picker chooses, i.e. the shipped table)
    "o": [None, PINGPONG, COOP, COOP_256x128],
    "uncond_o": [None, PINGPONG, COOP],
    "w2": [None, PINGPONG, COOP],
    "uncond_w2": [None, PINGPONG, COOP, COOP_256x128, G(1, 128, 256, 4, group_m=16)],
    "qkv": [None, PINGPONG, COOP],
    "uncond_qkv": [None],
    "w1/w3": [None],
    "uncond_w1/w3": [None],
    "llm_cond_proj": [
        None, G(1, 128, 256, 4, split_k=5), G(2, 128, 128, 5, split_k=4),
        # partials TMA-reduce-added into one zeroed sum (split_add): more splits cost no extra traffic
        G(1, 128, 256, 4, split_k=5, split_add=1), G(1, 128, 256, 4, split_k=6, split_add=1),
        G(1, 128, 256, 4, split_k=11, split_add=1), G(2, 128, 128, 5, split_k=11, split_add=1),
        G(1, 128, 256, 4, split_k=7, split_add=1), G(1, 128, 256, 4, split_k=9, split_add=1),
        G(2, 128, 128, 5, split_k=10, split_add=1),
    ],
}


def operand_sets(M, N, K, gen, count=2) -> list[tuple]:
    """``count`` sets (x with outlier channels, w int8, w_scale, bf16 bias); two exceed L2 together."""
    sets = []
    for _ in range(count):
        x = (torch.randn(M, K, device="cuda", generator=gen) * 0.5).bfloat16()
        x[:, :: max(K // 37, 1)] *= 30
        w, ws = Kn.quantize_weight_ref(torch.randn(N, K, device="cuda", generator=gen) * 0.02)
        sets.append((x, w, ws, torch.randn(N, device="cuda", generator=gen).bfloat16()))
    return sets


def bf16_operands(sets) -> list[tuple]:
    """(x, bf16 weight = dequantized int8 rows, bias) per operand set: the bf16 peer of the same linear."""
    return [(st[0], (st[1].float() * st[2].float().reshape(-1, 1)).bfloat16(), st[3]) for st in sets]


def _pinned_call(cfg, st):
    """One whole linear with ``cfg`` pinned (None: the picker's choice); the pin is host-side, so a
    graph captured around this call replays the pinned kernels."""
    shipped_pick = autotune.PICKER.pick
    if cfg is not None:
        autotune.PICKER.pick = lambda *a, **kw: (cfg, "ab pin")
    try:
        return Kn.w8a8_linear(*st, path="triton-int8")
    finally:
        autotune.PICKER.pick = shipped_pick


def _linear_ms(cfg, sets) -> float:
    """GPU ms of one whole linear with ``cfg`` pinned (None: the picker's own choice), rotating over
    the operand sets (x, w, w_scale, bias)."""
    return graph_ms([lambda st=st: _pinned_call(cfg, st) for st in sets], reps=5)


def _sustained(name, sets, seconds) -> list:
    """[(ms, label, MHz)] fastest first under sustained load, bf16 F.linear among them."""
    variants = {
        "shipped" if c is None else c.key(): [lambda c=c, st=st: _pinned_call(c, st) for st in sets]
        for c in CANDIDATES.get(name, [None])
    }
    variants["bf16"] = [lambda b=b: torch.nn.functional.linear(*b) for b in bf16_operands(sets)]
    res = sustained_ms(variants, seconds=seconds)
    return sorted((ms, label, mhz) for label, (ms, mhz) in ((k, v) for k, v in res.items() if not isinstance(v, str)))


def rank_burst(name, candidates, gen) -> list:
    """[(ms, label)] fastest first of the whole linear at shape ``name`` with each candidate config
    pinned (None: the shipped pick), interleaved rounds of CUDA-graph replays; printed as one line."""
    M, N, K = SHAPES[name]
    sets = operand_sets(M, N, K, gen)
    ranked = rank_interleaved(
        {"shipped" if c is None else c.key(): (lambda c=c, sets=sets: _linear_ms(c, sets)) for c in candidates}
    )
    print(f"{name} ({M}x{N}x{K}): " + ", ".join(f"{k} {ms * 1e3:.1f}us" for ms, k in ranked), flush=True)
    del sets
    torch.cuda.empty_cache()
    return ranked


def save_out(filename: str, result: dict) -> None:
    """``result`` as JSON to $OUT/``filename`` when $OUT is set (the device run's returned folder)."""
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], filename), "w") as f:
            json.dump(result, f, indent=1)


def main():
    argv = sys.argv[1:]
    seconds = 0.0
    if argv[:1] == ["--sustained"]:
        seconds, argv = float(argv[1]), argv[2:]
    names = argv or list(CANDIDATES)
    gen = torch.Generator(device="cuda").manual_seed(0)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "shapes": {},
    }
    for name in names:
        if not seconds:
            result["shapes"][name] = rank_burst(name, CANDIDATES.get(name, [None]), gen)
            continue
        M, N, K = SHAPES[name]
        sets = operand_sets(M, N, K, gen)
        ranked = _sustained(name, sets, seconds)
        bf16_ms = next(ms for ms, label, _ in ranked if label == "bf16")
        print(f"{name} ({M}x{N}x{K}) sustained: " + ", ".join(
            f"{k} {ms * 1e3:.1f}us @{mhz or 0:.0f}MHz ({bf16_ms / ms:.3f}x bf16)" for ms, k, mhz in ranked
        ), flush=True)  # fmt: skip
        result["shapes"][name] = ranked
        del sets
        torch.cuda.empty_cache()
    save_out("ab_linear.json", result)


if __name__ == "__main__":
    main()
