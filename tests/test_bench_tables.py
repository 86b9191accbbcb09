"""The benchmark's printed tables (CPU): the sustained-load block reads the row fields that
bench/gemm._time_peers writes, and a peer that was not measured prints as '-'."""

from __future__ import annotations

import pytest

gemm = pytest.importorskip("comfyui_ideogram4_int8.bench.gemm")


def _row(shape, ours, bf16, ck=None):
    row = {"shape": shape, "triton-int8_sustained_ms": ours, "triton-int8_sustained_mhz": 1650.0}
    row["bf16_sustained_ms"], row["bf16_sustained_mhz"] = bf16, 1275.0
    row["sustained_speedup_vs_bf16"] = bf16 / ours
    if ck is not None:
        row["ck-int8_sustained_ms"], row["ck-int8_sustained_mhz"] = ck, None  # clock not read
        row["sustained_speedup_vs_ck-int8"] = ck / ours
    return row


def test_sustained_block_prints_times_clocks_and_ratios(capsys):
    gemm.print_sustained([_row("llm_cond_proj", 0.245, 0.396, ck=0.418), _row("o", 0.2, 0.3)])
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("sustained load")
    llm = next(line for line in out if line.startswith("llm_cond_proj"))
    assert "0.245ms @ 1650MHz" in llm and "0.396ms @ 1275MHz" in llm and "0.418ms @    0MHz" in llm
    assert f"{0.396 / 0.245:>7.2f}x" in llm and f"{0.418 / 0.245:>7.2f}x" in llm
    o_line = next(line for line in out if line.startswith("o "))
    # o has no ck / fp8 measurement: those columns and ratios are '-', not a number or a crash
    assert o_line.count(" -") == 4 and f"{0.3 / 0.2:>7.2f}x" in o_line


def test_sustained_peers_are_the_target_peers():
    assert set(gemm.SUSTAINED_PEERS) == {"triton-int8"} | set(gemm.TARGETS)
