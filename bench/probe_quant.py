"""Activation quantizer launch variants at the Ideogram 4 activation shapes, GPU time by CUDA-graph
replay (rotating over two inputs that together exceed L2), against two copy references: a 512 MB
device copy (the bench's "copy bandwidth") and a copy moving the same bytes as the quantizer
(read 2MK + write MK), which carries the same launch ramp and tail.
Usage: python bench/probe_quant.py   (table to stdout; JSON to $OUT/probe_quant.json)"""

from __future__ import annotations

import json
import os

import torch
from comfyui_ideogram4_int8.bench.timing import graph_ms
from comfyui_ideogram4_int8.kernels import quant_triton as QT


def one_pass(block_k, tail_k, warps, block_m=1, per_sm=0, stages=1):
    return dict(BLOCK_M=block_m, BLOCK_K=block_k, ONE_PASS=True, TAIL_K=tail_k, num_warps=warps,
                PROGRAMS_PER_SM=per_sm, NUM_STAGES=stages)  # fmt: skip


def two_pass(block_k, warps, block_m=1, per_sm=0, stages=1):
    return dict(BLOCK_M=block_m, BLOCK_K=block_k, ONE_PASS=False, TAIL_K=0, num_warps=warps,
                PROGRAMS_PER_SM=per_sm, NUM_STAGES=stages)  # fmt: skip


SHAPES = {
    (4608, 4608): [
        one_pass(4096, 512, 2), one_pass(4096, 512, 8), one_pass(4096, 512, 8, block_m=2),
        one_pass(4096, 512, 4, block_m=2), one_pass(4096, 512, 4, per_sm=16, stages=2),
        one_pass(4096, 512, 4, per_sm=12, stages=2), one_pass(4096, 512, 8, per_sm=8, stages=2),
    ],
    (4096, 4608): [one_pass(4096, 512, 2), one_pass(4096, 512, 8), one_pass(4096, 512, 4, per_sm=16, stages=2)],
    (4608, 12288): [
        one_pass(8192, 4096, 16), two_pass(4096, 8), two_pass(4096, 8, per_sm=4), two_pass(4096, 8, per_sm=6),
        two_pass(2048, 4), two_pass(4096, 4), two_pass(8192, 16),
    ],
    (4096, 12288): [one_pass(8192, 4096, 16), two_pass(4096, 8), two_pass(4096, 8, per_sm=4)],
    (512, 53248): [
        two_pass(8192, 16, per_sm=1), two_pass(8192, 16, per_sm=2), two_pass(8192, 16, per_sm=3),
        two_pass(8192, 32, per_sm=1), two_pass(8192, 32, per_sm=2), two_pass(16384, 32, per_sm=1),
        two_pass(16384, 32, per_sm=2), two_pass(16384, 16, per_sm=2), two_pass(8192, 16, per_sm=2, stages=2),
    ],
}


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    src = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    big_copy = 2 * src.numel() / (graph_ms([lambda: dst.copy_(src)], calls=4) * 1e-3) / 1e9
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_512mb_gbps": big_copy, "rows": []}
    print(f"{out['gpu']}: 512 MB copy {big_copy:.0f} GB/s")
    for (M, K), extra in SHAPES.items():
        xs = [(torch.randn(M, K, device="cuda", generator=gen) * 0.5).bfloat16() for _ in range(2)]
        nbytes = M * K * 3 + 4 * M
        half = nbytes // 2
        pairs = [(dst[:half], src[:half]), (dst[half : 2 * half], src[half : 2 * half])]
        same = nbytes / (graph_ms([lambda d=d, s=s: d.copy_(s) for d, s in pairs]) * 1e-3) / 1e9
        print(f"{M}x{K}: same-bytes copy {same:.0f} GB/s ({100 * same / big_copy:.0f}% of the 512 MB copy)")
        default = QT.quant_launch_params(M, K)
        for params in [default] + extra:
            try:
                ms = graph_ms([lambda x=x, p=params: QT.quantize_rows_triton(x, None, p) for x in xs])
            except Exception as exc:  # a variant that does not compile / fit
                print(f"  {params}: failed {type(exc).__name__}: {str(exc)[:120]}")
                continue
            gbps = nbytes / (ms * 1e-3) / 1e9
            row = {"M": M, "K": K, "params": params, "default": params is default, "us": ms * 1e3, "gbps": gbps,
                   "pct_512mb_copy": 100 * gbps / big_copy, "pct_same_bytes_copy": 100 * gbps / same}  # fmt: skip
            out["rows"].append(row)
            mark = "*" if params is default else " "
            pct = f"{row['pct_512mb_copy']:4.0f}% / {row['pct_same_bytes_copy']:4.0f}%"
            print(f"  {mark} {ms * 1e3:6.1f} us {gbps:6.0f} GB/s {pct}  {params}", flush=True)
        del xs
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe_quant.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
