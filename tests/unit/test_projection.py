"""The per-card projection (bench/projection.py, docs/projection.md) on the CPU: its formula on a tiny input worked
by hand, and its committed inputs read as they are meant to be."""

from __future__ import annotations

import json

import pytest

projection = pytest.importorskip("comfyui_ideogram4_int8.bench.projection")

TABLE = """# a kernel table of two runs
A = runs/a: 100.0 ms of kernels per step (steps 4-7 of a 12-step run)
B = runs/b: 90.0 ms of kernels per step (steps 4-7 of a 12-step run)
kernel                                     A n     A ms    B n     B ms   B-A ms
int8 gemm                                   10   40.000     10   40.000   +0.000
portable gemm<>(int, a b)                    4    2.000      6    7.000   +5.000
bf16 gemm                                    2   20.000      0    0.000  -20.000
flash attention                              2   30.000      2   30.000   +0.000
norm                                         8    8.000      8    8.000   +0.000

A per run, beyond 12 x its per-step table: 1 ms
kernel                                     launches        ms
bf16 gemm                                        +4    +8.424
"""


def _inputs(tmp_path) -> dict:
    (tmp_path / "table.txt").write_text(TABLE)
    model = {"blocks": 1, "protected_w2": 1, "emb": 10, "qkv": 30, "ffn": 20, "tokens": [5, 5], "text_tokens": 0}
    model["llm_features"] = 0
    gemms = [["A", "int8 gemm"], ["A", "portable gemm"]]
    runs = {
        "bf16": {"column": "A", "classes": {"int8_gemm": gemms, "protected_gemm": [["A", "bf16 gemm"]]}},
        "fp8": {
            "column": "B",
            "classes": {
                "int8_gemm": [["B", "int8 gemm"], ["A", "portable gemm"]],
                "protected_gemm": [["B", "portable gemm"], ["-A", "portable gemm"]],
            },
        },
    }
    for run in runs.values():
        run["classes"]["attention"] = [[run["column"], "flash"]]
    rates = {"x": {"int8": 100, "fp8": 50, "bf16": 25}, "old": {"int8": 100, "fp8": None, "bf16": 25}}
    # the reference at 200 / 200 / 100 Tops and 1000 GB/s; the card at half each (and a quarter of fp8) and 500 GB/s
    card = {"name": "half", "arch": "x", "sms": 1, "boost_mhz": 1e6, "vram_gb": 12, "dram_gbs": 500, "bus_gbs": 1}
    return {
        "kernel_table": "table.txt",
        "model": model,
        "runs": runs,
        "reference": {"name": "ref", "int8_tops": 200, "fp8_tflops": 200, "bf16_tflops": 100, "dram_gbs": 1000},
        "rates_per_sm_clock": rates,
        "cards": [card, {**card, "name": "no fp8", "arch": "old", "vram_gb": 24}],
        "streamed_gib_per_step": {"bf16": {"12": [0.5, ""], "24": [0.0, ""]}, "fp8": {"12": [0.2, ""]}},
    }


def test_the_formula_on_a_tiny_input_worked_by_hand(tmp_path):
    inputs = _inputs(tmp_path)
    # the card's rates: rate per SM per clock x 1 SM x 1e12 Hz = 100 / 50 / 25 Tops: half the reference's int8 and
    # bf16, a quarter of its fp8
    rows = {(r["card"], r["protected"]): r for r in projection.project(inputs, root=tmp_path, steps=10)}
    ref = rows[("ref, measured", "bf16")]
    assert ref["ms"] == {"int8_gemm": 42.0, "protected_gemm": 20.0, "attention": 30.0, "memory": 8.0}
    assert ref["compute_ms"] == 100.0 and ref["streaming_hides"] is None
    half = rows[("half", "bf16")]
    # every compute class twice as long (int8: 200 -> 100; bf16: 100 -> 25 is a quarter: protected and attention x4),
    # memory x2 (1000 -> 500 GB/s)
    assert half["ms"] == {"int8_gemm": 84.0, "protected_gemm": 80.0, "attention": 120.0, "memory": 16.0}
    assert half["compute_ms"] == 300.0
    # 0.5 GiB over 1 GB/s: 536.9 ms, longer than the compute: not hidden, the step is the bus
    assert half["bus_ms"] == 536.9 and half["streaming_hides"] is False and half["step_ms"] == 536.9
    assert half["image_s"] == 5.4
    fp8 = rows[("half", "fp8")]
    # run B: int8 40 (B) + 2 (A's portable share); protected 7 - 2 = 5 ms at fp8 200 -> 50: x4
    assert rows[("ref, measured", "fp8")]["ms"]["protected_gemm"] == 5.0
    assert fp8["ms"]["int8_gemm"] == 84.0 and fp8["ms"]["protected_gemm"] == 20.0
    assert fp8["ms"]["memory"] == 2 * (90.0 - 42.0 - 5.0 - 30.0)
    assert fp8["compute_ms"] == 250.0
    # 0.2 GiB: 214.7 ms, inside the compute: hidden, the step is the compute
    assert fp8["bus_ms"] == 214.7 and fp8["streaming_hides"] is True and fp8["step_ms"] == 250.0
    # a card without fp8 tensor cores gets no fp8 row; a card that holds both branches streams nothing
    assert ("no fp8", "fp8") not in rows and rows[("no fp8", "bf16")]["bus_ms"] == 0.0
    # the work of each class from the model's shapes (2 ops per multiply-add)
    ops = projection.work(inputs["model"])
    assert ops["protected_gemm"] == 2.0 * 10 * 1 * 20 * 10  # tokens x protected x ffn x emb
    assert ops["int8_gemm"] == 2.0 * 10 * (1 * 10 * (30 + 10 + 2 * 20) + 0 * 20 * 10)  # qkv, o, w1, w3; no w2 left
    assert ops["attention"] == 4.0 * 1 * 10 * (25 + 25)  # QK^T and PV per branch: 4 N^2 emb


def test_a_kernel_named_by_an_ambiguous_prefix_is_refused(tmp_path):
    inputs = _inputs(tmp_path)
    inputs["runs"]["bf16"]["classes"]["attention"] = [["A", "n"]]  # "norm" alone starts with it
    projection.project(inputs, root=tmp_path)
    inputs["runs"]["bf16"]["classes"]["attention"] = [["A", ""]]
    with pytest.raises(ValueError, match="rows of the kernel table start with it"):
        projection.project(inputs, root=tmp_path)


def test_the_committed_inputs_reproduce_the_h200_and_give_every_card_a_row():
    inputs = json.loads(projection.DEFAULT_INPUTS.read_text())
    rows = projection.project(inputs)
    measured = {r["protected"]: r for r in rows if r["streamed_gib"] is None}
    # the measured step: the kernel table's header, every class a positive share of it
    assert measured["bf16"]["compute_ms"] == 174.1 and measured["fp8"]["compute_ms"] == 164.9
    assert all(v > 0 for r in measured.values() for v in r["ms"].values())
    assert all(0.3 < e < 1.0 for r in measured.values() for e in r["eta"].values())
    names = {c["name"] for c in inputs["cards"]}
    assert {r["card"] for r in rows if r["protected"] == "bf16"} >= names
    fp8_cards = {r["card"] for r in rows if r["protected"] == "fp8" and r["streamed_gib"] is not None}
    assert fp8_cards == {c["name"] for c in inputs["cards"] if c["arch"] != "ampere"}
    # the per-SM rates give each architecture's flagship its whitepaper number
    rates = inputs["rates_per_sm_clock"]
    for name, int8_tops in (("RTX 3090", 284), ("RTX 4090", 660.6), ("RTX 5090", 838)):
        card = next(c for c in inputs["cards"] if c["name"] == name)
        assert projection.card_peaks(card, rates)["int8"] / 1e12 == pytest.approx(int8_tops, rel=5e-3)


def test_the_command_prints_the_table_labelled_as_projections(capsys):
    assert projection.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PROJECTIONS, not measurements") and "| RTX 4060 Ti 16 GB | bf16 |" in out


def test_the_table_in_the_docs_is_the_one_the_command_prints():
    inputs = json.loads(projection.DEFAULT_INPUTS.read_text())
    doc = (projection.ROOT / "docs" / "projection.md").read_text()
    assert projection.table(projection.project(inputs, steps=20), 20) in doc
