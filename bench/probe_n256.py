"""Probe: the n = 256 int8 wgmma rewrite (kernels/wgmma_n256.py) against the kernels as Triton compiles them,
and the balanced split-K work lists (kernels/splitk_schedule.py) for llm_cond_proj.

1. Exactness: raw int32 GEMM with the rewrite vs torch._int_mm (fresh data, outlier channels) at the
   llm_cond_proj split-K shape, a cooperative and a ping-pong 64x256 large shape, and odd shapes; the
   whole linear with and without the rewrite must be bit-identical.
2. Whole-linear A/B (activation quant included, CUDA-graph replay, interleaved rounds) of each shape's
   shipped config, the same config with the rewrite, and rewrite-only candidates.
Usage: python bench/probe_n256.py [shape ...]   (JSON to $OUT/probe_n256.json)"""

from __future__ import annotations

import sys

import torch
from comfyui_ideogram4_int8.bench.ab_linear import _pinned_call, operand_sets, rank_burst, save_out
from comfyui_ideogram4_int8.kernels import gemm_gluon as GG
from comfyui_ideogram4_int8.kernels.configs import G

PP128 = G(2, 128, 128, 5)
COOP = G(1, 128, 256, 4)
COOP_N = G(1, 128, 256, 4, n256=1)
PP64_N = G(2, 64, 256, 4, n256=1)
CANDIDATES = {
    "qkv": [None, COOP, COOP_N, PP64_N],
    "o": [None, COOP, COOP_N, PP64_N],
    "w1/w3": [None, COOP, COOP_N, PP64_N],
    "w2": [None, COOP, COOP_N, PP64_N],
    "uncond_qkv": [None, COOP_N, PP64_N],
    "uncond_o": [None, COOP_N, PP64_N],
    "uncond_w2": [None, COOP, COOP_N, PP64_N],
    "llm_cond_proj": [
        None, G(1, 128, 256, 4, split_k=5, split_add=1), G(1, 128, 256, 4, split_k=5, split_add=1, n256=1),
        # balanced per-CTA work lists (splitk_schedule.py) of ~2 / 3 / 4 units
        G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=2),
        G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=3),
        G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=4),
        G(1, 128, 256, 4, split_k=5, split_add=1, sched=3),
    ],
}
EXACT = [  # (M, N, K, gluon config)
    (512, 4608, 53248, G(1, 128, 256, 4, split_k=5, split_add=1, n256=1)),
    (333, 4608, 53248, G(1, 128, 256, 4, split_k=7, split_add=1, n256=1)),
    (512, 4608, 53248, G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=3)),
    (333, 4608, 53248, G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=2)),
    (77, 4608, 53248, G(1, 128, 256, 4, split_k=5, split_add=1, sched=4)),
    (4608, 13824, 4608, COOP_N),
    (4608, 13824, 4608, PP64_N),
    (77, 4624, 4608, COOP_N),
    (1000, 296, 1040, PP64_N),
]


def exactness(gen) -> list[str]:
    rows = []
    for M, N, K, cfg in EXACT:
        q = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda", generator=gen)
        q[:, :: max(K // 29, 1)] = 127
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda", generator=gen)
        ref = torch._int_mm(q, w.t())
        gc = cfg.gluon_config()
        out = torch.full((M, N), -7, dtype=torch.int32, device="cuda")
        res = GG.launch_gemm_gluon(q, w, None, None, None, out, raw_int32=True, cfg=gc)
        opt = GG.LAST_LAUNCH["kernel"].metadata.ir_override if res is not None else None
        ok = res is not None and torch.equal(out, ref)
        # the rewrite really ran: the launched kernel carries the override and its PTX has n = 256 wgmma
        ran = bool(opt) and "m64n256k32" in GG.LAST_LAUNCH["kernel"].asm["ptx"]
        rows.append(f"exact {M}x{N}x{K} {gc.key()}: {'OK' if ok else 'MISMATCH'} n256_ran={ran} "
                    f"fallback={GG.N256_FALLBACKS.get(gc.key())}")  # fmt: skip
        print(rows[-1], flush=True)
    # whole linear, bf16 out with bias: identical with and without the rewrite
    M, N, K = 512, 4608, 53248
    (st,) = operand_sets(M, N, K, gen, count=1)
    a = _pinned_call(G(1, 128, 256, 4, split_k=5, split_add=1), st)
    b = _pinned_call(G(1, 128, 256, 4, split_k=5, split_add=1, n256=1), st)
    rows.append(f"whole linear llm_cond_proj sk5a vs sk5a_n256 identical: {torch.equal(a, b)}")
    print(rows[-1], flush=True)
    return rows


def main():
    names = sys.argv[1:] or list(CANDIDATES)
    gen = torch.Generator(device="cuda").manual_seed(0)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "exact": exactness(gen), "shapes": {}}  # fmt: skip
    for name in names:
        result["shapes"][name] = rank_burst(name, CANDIDATES[name], gen)
    save_out("probe_n256.json", result)


if __name__ == "__main__":
    main()
