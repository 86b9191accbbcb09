"""Probe: variants of the balanced split-K work lists (kernels/splitk_schedule.py) for llm_cond_proj,
whole linear (activation quant included) in interleaved rounds. Each variant is a (units per CTA,
per-unit overhead in k steps, local-search steps) triple fed to splitk_schedule.build through the
config's ``sched`` slot (the kernel is the same; only its work-list table differs).
Usage: python bench/probe_sched.py   (JSON to $OUT/probe_sched.json)"""

from __future__ import annotations

import torch
from comfyui_ideogram4_int8.bench.ab_linear import _linear_ms, operand_sets, save_out
from comfyui_ideogram4_int8.bench.gemm import SHAPES
from comfyui_ideogram4_int8.bench.timing import rank_interleaved
from comfyui_ideogram4_int8.kernels import splitk_schedule as S
from comfyui_ideogram4_int8.kernels.configs import G

VARIANTS = {  # sched slot -> (units per CTA, overhead steps, local-search steps)
    2: (2, 8, 0), 3: (3, 8, 0), 4: (2, 8, 1500), 5: (3, 8, 1500), 6: (2, 14, 1500), 7: (3, 14, 1500), 8: (2, 4, 1500),
    9: (3, 4, 1500),
}
_build = S.build


def main():
    S.build = lambda m, n, k, ctas, slot, *a: _build(m, n, k, ctas, *VARIANTS[slot])
    M, N, K = SHAPES["llm_cond_proj"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = operand_sets(M, N, K, gen)
    base = G(1, 128, 256, 4, split_k=5, split_add=1, n256=1)
    variants = {"sk5a_n256": (lambda: _linear_ms(base, sets))}
    for slot, (r, o, steps) in VARIANTS.items():
        cfg = G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=slot)
        ctas = torch.cuda.get_device_properties(0).multi_processor_count
        rows, _ = _build(M // 128, N // 256, K // 128, ctas, r, o, steps)
        label = f"R{r}_o{o}_ls{steps} (model max {S.max_load(rows, 8)} at o=8)"
        variants[label] = lambda cfg=cfg: _linear_ms(cfg, sets)
    ranked = rank_interleaved(variants)
    for ms, k in ranked:
        print(f"{ms * 1e3:7.1f} us  {k}", flush=True)
    save_out("probe_sched.json", {"gpu": torch.cuda.get_device_name(), "ranked": ranked})


if __name__ == "__main__":
    main()
