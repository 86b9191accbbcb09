"""Balanced split-K work lists (kernels/splitk_schedule.py) on the CPU: every (tile, k step) exactly
once, the balance the local search reaches against the ideal, determinism, the kernel's table layout,
the host rules, and an offline sm_90a compile of the listed mode (SPLIT_MODE 2)."""

from __future__ import annotations

import pytest
import torch
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels import gemm_gluon as G
from comfyui_ideogram4_int8.kernels import splitk_schedule as S
from test_gemm_gluon_compile import _ptxas_present, needs_gluon, pristine_triton_language  # noqa: F401

LLM = (4, 18, 416)  # llm_cond_proj at M 512: 4 x 18 tiles of 128 x 256, 416 k steps of 128


@pytest.mark.parametrize("tiles", [LLM, (3, 18, 416), (1, 18, 416), (2, 5, 7), (1, 1, 3), (5, 3, 1000)])
@pytest.mark.parametrize("ctas,units", [(132, 2), (132, 3), (78, 2), (7, 1)])
def test_every_k_step_of_every_tile_exactly_once(tiles, ctas, units):
    rows, u = S.build(*tiles, ctas, units)
    assert len(rows) == ctas and u == max(len(r) for r in rows)
    S.check_cover(rows, *tiles)
    # the M tiles of a weight strip share their cuts (the weight panel is read once per k range)
    cuts = {}
    for r in rows:
        for m, n, k0, nk in r:
            cuts.setdefault((n, m), []).append((k0, nk))
    for (n, m), ranges in cuts.items():
        assert sorted(ranges) == sorted(cuts[(n, 0)]), (n, m)


def test_check_cover_names_the_hole_and_the_overlap():
    rows, _ = S.build(*LLM, 132, 2)
    (m, n, k0, nk), *rest = rows[5]
    with pytest.raises(ValueError, match="never"):
        S.check_cover([[(m, n, k0, nk - 1), *rest]] + rows[:5] + rows[6:], *LLM)
    with pytest.raises(ValueError, match="twice"):
        S.check_cover([[(m, n, k0, nk + 1), *rest]] + rows[:5] + rows[6:], *LLM)


def test_balance_close_to_ideal_and_deterministic():
    rows, _ = S.build(*LLM, 132, 2)
    ideal = 4 * 18 * 416 / 132 + 2 * S.UNIT_OVERHEAD_STEPS  # every CTA the mean load in 2 units
    plain, _ = S.build(*LLM, 132, 2, refine_steps=0)
    assert S.max_load(rows) <= 1.03 * ideal < S.max_load(plain)
    # round-robin split-K 5 (the previous pick): 96 CTAs run 3 units of 84 steps
    assert S.max_load(rows) < 0.92 * 3 * (84 + S.UNIT_OVERHEAD_STEPS)
    assert S.build(*LLM, 132, 2) == (rows, 2)


def test_table_layout():
    rows = [[(0, 1, 0, 5), (2, 3, 5, 7)], [(1, 1, 0, 12)]]
    assert S.table(rows, 2) == [[2, 0, 1, 0, 5, 2, 3, 5, 7], [1, 1, 1, 0, 12, 0, 0, 0, 0]]


def test_config_rules_and_launch_plan():
    cfg = C.G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=2)
    assert cfg.key().endswith("_sk5a_n256_lpt2") and G.validate(cfg.gluon_config()) is None
    assert C.GemmConfig.from_dict(cfg.as_dict()) == cfg
    for bad in (C.G(1, 128, 256, 4, split_k=5, sched=2), C.G(2, 128, 128, 5, split_k=5, split_add=1, sched=2)):
        assert "sched_units" in G.validate(bad.gluon_config())
    M, N, K = 333, 4608, 53248
    q, w = torch.empty(M, K, dtype=torch.int8), torch.empty(N, K, dtype=torch.int8)
    gc = cfg.gluon_config()
    ws = torch.empty(G.workspace_shape(gc, M, N, K), dtype=torch.int32)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    _, grid, args, kwargs = G.build_launch(q, w, torch.empty(M), torch.empty(N), None, out, cfg=gc, num_sms=132, ws=ws)
    assert grid == (132,) and kwargs["SPLIT_MODE"] == 2
    kps, table = args[9], args[10]
    assert table.dtype == torch.int32 and tuple(table.shape) == (132, kps)
    rows = [[tuple(r[1 + 4 * j : 5 + 4 * j]) for j in range(r[0])] for r in table.tolist()]
    S.check_cover(rows, 3, 18, 416)


@needs_gluon
@pytest.mark.skipif(not _ptxas_present(), reason="triton's bundled ptxas not found")
def test_offline_compile_of_the_listed_mode():
    from comfyui_ideogram4_int8.bench.compile_gluon_sm90 import compile_splitk, cubin_stats, ptx_stats

    cfg = C.G(1, 128, 256, 4, split_k=5, split_add=1, sched=2).gluon_config()
    (kernel, grid, args, kwargs), ck = compile_splitk(cfg, M=333)
    assert kwargs["SPLIT_MODE"] == 2
    st = ptx_stats(ck.asm["ptx"])
    assert st["tma_reduce_add"] >= cfg.block_n // cfg.epi_n and st["tma_store"] == 0
    cb = cubin_stats(ck.asm["cubin"])
    if "error" not in cb:
        assert cb["sass_spill_ops"] == 0 and cb.get("local", 0) == 0 and cb["sass_GMMA"] > 0
