"""The benchmark's printed tables (CPU): the sustained-load block reads the row fields that
bench/gemm._time_peers writes, and a peer that was not measured prints as '-'."""

from __future__ import annotations

import pathlib

import pytest
import torch

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


def test_smooth_block_prints_unfolded_folded_and_the_folds_gain(capsys):
    o = {
        "shape": "o",
        "bf16_gpu_ms": 0.30,
        "triton-int8_gpu_ms": 0.18,
        "gpu_speedup_vs_bf16": 0.30 / 0.18,
        "triton-int8-smooth_gpu_ms": 0.21,
        "triton-int8-folded_gpu_ms": 0.18,
        "quant-only_gpu_ms": 0.023,
        "quant-smooth-only_gpu_ms": 0.044,
    }
    ffn = {
        "shape": "ffn_swiglu",
        "bf16_gpu_ms": 0.9,
        "triton-int8_gpu_ms": 0.45,
        "triton-int8-folded_gpu_ms": 0.45,
        "triton-int8-unfused-smooth_gpu_ms": 0.60,
        "triton-int8-ratio_gpu_ms": 0.55,
    }
    for row in (o, ffn):
        gemm._smooth_ratios(row)
    assert o["fold_gain_gpu"] == pytest.approx(0.21 / 0.18)
    assert o["triton-int8-smooth_gpu_speedup_vs_bf16"] == pytest.approx(0.30 / 0.21)
    assert ffn["fold_gain_gpu"] == pytest.approx(0.60 / 0.45)
    gemm.print_smooth([o, ffn])
    out = capsys.readouterr().out
    o_line = next(line for line in out.splitlines() if line.startswith("o "))
    assert "0.210ms  1.43x bf16" in o_line and f"{0.21 / 0.18:>10.2f}x" in o_line
    assert f"{0.044 / 0.023:>8.2f}x" in o_line  # the quantizer with the divide vs without
    ffn_line = next(line for line in out.splitlines() if line.startswith("ffn_swiglu"))
    assert "0.600ms  1.50x bf16" in ffn_line and "0.550ms  1.64x bf16" in ffn_line


def test_markdown_tables_align_the_columns_asked_and_refuse_a_row_past_the_header():
    """The shared Markdown table (gemm's report, the projection, the quantize-on-load probe): a right-aligned rule
    where asked, a short row (a failed run) kept short, a row longer than the header refused by its cell count."""
    from comfyui_ideogram4_int8.bench.report import markdown_table

    lines = markdown_table(("name", "ms", "ok"), [["qkv", 1.5, "yes"], ["w2", "failed: oom"]], right={1})
    assert lines == ["| name | ms | ok |", "|---|---:|---|", "| qkv | 1.5 | yes |", "| w2 | failed: oom |"]
    with pytest.raises(ValueError, match="4 cells for 3 columns"):
        markdown_table(("name", "ms", "ok"), [["qkv", 1, 2, 3]])


def test_comfy_tables_print_each_run_or_the_part_of_its_error_asked_for(capsys):
    from comfyui_ideogram4_int8.bench import report

    runs = {"ok": {"v": 1.5}, "bad": {"error": "0123456789"}}
    report.print_runs("title", ("run", 6), "    v", runs, lambda e: report.two_places(e, "v", "x").rjust(5))
    report.print_runs("again", ("run", 6), "", {"bad": runs["bad"]}, None, failed=slice(-3, None))
    assert capsys.readouterr().out.splitlines() == [
        "",
        "title",
        "run       v",
        "ok    1.50x",
        "bad    FAILED: 0123456789",
        "",
        "again",
        "run   ",
        "bad    FAILED: 789",
    ]


def test_comfy_compiles_per_process_on_the_whole_gpu_only(tmp_path, capsys):
    """--vram runs per-card children; a compiled child runs on the whole GPU (streaming under compile is not
    measured), so --compile with an emulated card is refused rather than dropped without a word."""
    from comfyui_ideogram4_int8.bench.comfy import cli

    base = ["--comfyui", str(tmp_path), "--workdir", str(tmp_path), "--compile=default"]
    with pytest.raises(SystemExit):
        cli.parse([*base, "--vram", "0,8"])
    assert "--compile with --vram runs on the whole GPU only (--vram 0)" in capsys.readouterr().err
    a = cli.parse([*base, "--vram", "0"])
    assert a.compile == ["default"] and a.vram == [0.0]


def test_comfy_vram_ratios_of_compiled_runs_are_to_their_eager_run_and_compiled_natives():
    from comfyui_ideogram4_int8.bench.comfy import report

    runs = {
        "native-int8-convrot@resident": {"step_ms_median": 340.0, "sm_mhz_median": 1980.0},
        "native-int8-convrot compiled:default@resident": {"step_ms_median": 320.0},
        "ours-w8a8@resident": {"step_ms_median": 200.0, "sm_mhz_median": 1900.0},
        "ours-w8a8 compiled:default@resident": {"step_ms_median": 160.0, "compiled": "default"},
    }
    report.card_ratios({"runs": runs})
    ours = runs["ours-w8a8 compiled:default@resident"]
    assert ours["speedup_vs_eager"] == 1.25 and ours["eager_sm_mhz"] == 1900.0
    assert ours["speedup_vs_native-int8-convrot"] == 2.0  # against the native compiled the same way, not eager
    assert ours["x_ours_resident"] == 0.8  # against the pack's eager resident run
    assert runs["ours-w8a8@resident"]["speedup_vs_native-int8-convrot"] == 1.7
    assert "speedup_vs_eager" not in runs["ours-w8a8@resident"]


def test_comfy_vram_prints_the_bus_line_of_a_profiled_run(capsys):
    from comfyui_ideogram4_int8.bench.comfy import report

    bus = {"span_ms": 284.0, "bus_busy_ms": 270.5, "bus_idle_ms": 13.5, "compute_busy_ms": 200.1, "both_idle_ms": 2.0}
    bus["idle_at"] = {"none": 6.0, "gemm_kernel_#": 4.5}
    compiled = {"compiled": "default", "speedup_vs_eager": 1.2, "warmup_s": 80.5, "sm_mhz_median": 1665.0}
    compiled.update(watts_median=617.0, eager_sm_mhz=1980.0, frames_compiled={"warmup": 4, "timed_steps": 0})
    report.print_passes(
        {"runs": {"ours@8GB": {"bus": bus}, "native@8GB": {}, "ours compiled:default@resident": compiled}}
    )
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("ours@8GB")
    assert out[1].startswith("ours compiled:default@resident")
    assert out[1].endswith(
        "compiled default: 1.2x its eager run, warm-up 80.5 s, SM 1665.0 MHz (617.0 W) against 1980.0; "
        "frames compiled in the timed steps: 0"
    )
    assert (
        "bus busy 270.5 / idle 13.5 of 284.0 ms; compute 200.1; neither 2.0; idle at: none 6.0, gemm_kernel_# 4.5"
        in out[0]
    )


def test_comfy_vram_says_which_steps_a_profiled_run_covers_and_what_its_run_had_beyond(capsys):
    from comfyui_ideogram4_int8.bench.comfy import report

    bus = {"span_ms": 180.0, "bus_busy_ms": 0.0, "bus_idle_ms": 180.0, "compute_busy_ms": 172.0, "both_idle_ms": 8.0}
    bus["idle_at"] = {"none": 180.0}
    per_run = {"kernels": {"Memcpy HtoD (Pageable -> Device)": {"count": 1.0, "ms": 4.4}}}
    per_run.update(launches_ms=4.4, timing_ms=1.5)
    per_run["bus"] = dict(bus, span_ms=430.0, both_idle_ms=427.0, gaps=[[427.5, 14.6, "none", "cudaMalloc", "before"]])
    entry = {"bus": bus, "profile": {"steps": [8, 11], "run_steps": 20}, "per_run": per_run}
    report.print_passes({"runs": {"ours-w8a8@resident": entry}})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "bus busy 0.0 / idle 180.0 of 180.0 ms" in out[1]
    assert out[0].startswith("ours-w8a8@resident")
    assert "kernels and bus per step: steps 8-11 of a 20-step run" in out[0]
    assert "launches 4.4 ms (Memcpy HtoD (Pageable -> Device) +1 +4.40), the same kernels 1.5 ms" in out[0]
    assert out[0].endswith("span +430.0 ms, neither busy +427.0 ms, its largest bus gap 427.5 ms (cudaMalloc)")


def test_comfy_vram_prints_where_the_first_images_host_time_went(capsys):
    """--profile-first: the first image's cProfile rows (ms in the whole image) print beside the run's own."""
    from comfyui_ideogram4_int8.bench.comfy import report

    first = {"seed": 0, "host_profile": {"cumulative": {"streaming_patcher.py:290(load)": [812.5, 2.0]}, "self": {}}}
    report.print_passes({"runs": {"ours-w8a8@16GB": {"images": [first, {"seed": 1}]}, "native-fp8@16GB": {}}})
    out = capsys.readouterr().out.splitlines()
    want = " first image, host cumulative ms: streaming_patcher.py:290(load) 812.5"
    assert out == ["ours-w8a8@16GB".ljust(34) + want]


def test_comfy_vram_profiled_run_cuts_at_the_samplers_step_callbacks():
    """The --kernels run: the hooks the timing callback calls at each step's end drive the profiler, and are gone
    after the run (the timed steps never see them), also when the run fails."""
    from comfyui_ideogram4_int8.bench.comfy import child
    from torch.profiler import ProfilerActivity

    hooks = []
    a = torch.randn(16, 16)

    def sample(steps):  # the set-up once, one matmul a step, each step's end told to the hooks
        torch.cumsum(a, 0)
        for i in range(steps):
            torch.mm(a, a)
            for hook in hooks:
                hook(i)

    out = child._profiled_run(sample, hooks, steps=8, count=2, activities=[ProfilerActivity.CPU])
    assert out["profile"] == {"steps": [3, 4], "run_steps": 8} and hooks == []
    assert out["kernels"]["aten::mm"]["count"] == 1 and "aten::cumsum" not in out["kernels"]
    assert out["per_run"]["kernels"]["aten::cumsum"]["count"] == 1

    def failing(steps):
        hooks[0](0)
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        child._profiled_run(failing, hooks, steps=4, count=2, activities=[ProfilerActivity.CPU])
    assert hooks == []


def test_comfy_kernel_steps_option():
    from comfyui_ideogram4_int8.bench.comfy import cli

    base = ["--comfyui", "/c", "--workdir", "/w", "--vram", "0", "--kernels"]
    assert cli.parse(base).kernel_steps == 4
    assert cli.parse([*base, "--kernel-steps", "2"]).kernel_steps == 2
    with pytest.raises(SystemExit):
        cli.parse([*base, "--kernel-steps", "0"])


def test_clock_watch_reads_medians_and_gives_none_without_nvml(monkeypatch):
    import time

    from comfyui_ideogram4_int8.bench import timing

    readings = iter([1980.0, 1755.0, 1755.0, 1600.0] + [1755.0] * 1000)
    monkeypatch.setattr(timing, "_nvml_sm_mhz", lambda: next(readings))
    monkeypatch.setattr(timing.torch.cuda, "power_draw", lambda: 690_000, raising=False)
    with timing.ClockWatch() as watch:
        time.sleep(0.15)
    assert watch.sm_mhz == 1755.0 and watch.watts == 690.0 and len(watch.clocks) >= 3
    monkeypatch.setattr(timing, "_nvml_sm_mhz", lambda: None)
    monkeypatch.setattr(timing.torch.cuda, "power_draw", lambda: 1 / 0, raising=False)
    with timing.ClockWatch() as watch:
        time.sleep(0.05)
    assert watch.sm_mhz is None and watch.watts is None
    # readings in the first skip_s are left out (sustained_ms: the clock is still leaving the previous window)
    monkeypatch.setattr(timing, "_nvml_sm_mhz", lambda: 1980.0)
    with timing.ClockWatch(skip_s=10.0) as watch:
        time.sleep(0.1)
    assert watch.clocks == [] and watch.sm_mhz is None


def test_host_profile_ranks_python_functions_by_host_time_per_step():
    from comfyui_ideogram4_int8.bench.comfy import child

    def slow_helper():
        return sum(i * i for i in range(200_000))

    def run():
        for _ in range(2):
            slow_helper()

    out = child.host_profile(run, steps=2, top=50)
    row = next(v for k, v in out["cumulative"].items() if k.endswith("(slow_helper)"))
    assert row[1] == 1.0 and row[0] > 0  # once per step, some ms
    assert all("/" not in k for k in out["self"])  # file names only, no machine paths


def test_comfy_compiles_each_mode_as_comfyui_users_do(monkeypatch):
    """Each --compile mode reaches ComfyUI's set_torch_compile_wrapper as its node sets it: TorchCompileModel's two
    backends with its guard filter, "blocks" one key per transformer block (KJNodes' way), the inductor modes by
    name; every MODEL is a non-dynamic clone."""
    import sys
    import types

    from comfyui_ideogram4_int8.bench.comfy import peers

    calls = []
    helpers = types.ModuleType("comfy_api.torch_helpers")
    helpers.set_torch_compile_wrapper = lambda model, **kw: calls.append((model, kw))
    monkeypatch.setitem(sys.modules, "comfy_api", types.ModuleType("comfy_api"))
    monkeypatch.setitem(sys.modules, "comfy_api.torch_helpers", helpers)

    class Patcher:
        def __init__(self, blocks, dynamic=True):
            self.blocks, self.dynamic = blocks, dynamic

        def clone(self, disable_dynamic=False):
            return Patcher(self.blocks, dynamic=not disable_dynamic)

        def get_model_object(self, key):
            assert key == "diffusion_model.layers"
            return [object()] * self.blocks

    models = (Patcher(3), Patcher(5))
    for mode in peers.COMPILE_MODES:
        calls.clear()
        out = peers.compiled_clones(models, mode)
        assert len(out) == 2 and all(not m.dynamic for m in out) and [m for m, _ in calls] == list(out)
        for (_, kw), n in zip(calls, (3, 5), strict=True):
            guard = kw.get("options", {}).get("guard_filter_fn")
            if mode == "blocks":
                assert kw["keys"] == [f"diffusion_model.layers.{i}" for i in range(n)] and kw["backend"] == "inductor"
            else:
                assert "keys" not in kw
            if mode in ("default", "cudagraphs", "blocks"):
                entries = [types.SimpleNamespace(name=x) for x in ("L['x']", "L['transformer_options']['k']")]
                assert guard(entries) == [True, False] and "mode" not in kw
                assert kw["backend"] == ("cudagraphs" if mode == "cudagraphs" else "inductor")
            else:
                assert guard is None and kw == {"backend": "inductor", "mode": mode}


def test_quantize_on_load_bench_times_the_shapes_it_is_given_and_checks_the_bits(tmp_path, capsys):
    """One real Ideogram 4 shape (adaln_modulation, 18432 x 512) from both sources: the pack's conversion and the
    twin give the same bits, the branch total is left out for a partial run, an unknown shape is refused by name."""
    import json

    from comfyui_ideogram4_int8.bench.probes import quantize_on_load as qol

    out = tmp_path / "q.json"
    assert qol.main(["--shapes", "adaln_modulation", "--reps", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["layer"], r["source"]) for r in rows] == [("adaln_modulation", "fp8"), ("adaln_modulation", "bf16")]
    assert all(r["same"] and r["count"] == 34 and (r["n"], r["k"]) == (18432, 512) for r in rows)
    assert result["branch"] == {}
    assert "| adaln_modulation | fp8 | 18432 x 512 | 34 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown \\['qkvv'\\]"):
        qol.main(["--shapes", "qkvv"])


def test_comfy_vram_image_floor_and_ratios_per_card(capsys):
    from comfyui_ideogram4_int8.bench.comfy import report

    def run(step, first, warm, streamed=0.0, bw=50.0):
        images = [{"seconds": first, "steps": 20, "graph_captures": 2, "plan_changes": 1}]
        images += [{"seconds": w, "steps": 20, "graph_captures": 0, "plan_changes": 0} for w in warm]
        return {
            "step_ms_median": step,
            "images": images,
            "image_s_first": first,
            "image_s_warm_median": sorted(warm)[len(warm) // 2],
            "gib_streamed_per_step": streamed,
            "pinned_gib_s": bw,
            "latent_equal_first": True,
        }

    runs = {
        "native-fp8@resident": run(260.0, 6.0, [5.4, 5.2]),
        "ours-w8a8@resident": run(170.0, 4.4, [3.5, 3.6]),
        "native-fp8@12GB": run(330.0, 7.0, [6.8, 6.6]),
        "ours-w8a8@12GB": run(280.0, 6.5, [6.0, 6.2], streamed=10.0),
    }
    result = {"info": {"steps": 20, "images": 3, "size": "1024x1024", "setup": "server"}, "runs": runs}
    report.card_ratios(result)
    res, capped = runs["ours-w8a8@resident"], runs["ours-w8a8@12GB"]
    assert res["image_s_floor"] == 3.4  # 20 x the resident step
    assert res["image_x_floor"] == round(3.6 / 3.4, 3) and res["image_x_steps"] == round(3.6 / 3.4, 3)
    assert res["image_speedup_vs_native-fp8"] == round(5.4 / 3.6, 3)
    # streamed: 10 GiB per step at 50 GiB/s is 200 ms, above the 170 ms resident step
    assert capped["image_s_floor"] == 4.0 and capped["image_x_floor"] == round(6.2 / 4.0, 3)
    assert capped["image_speedup_vs_native-fp8"] == round(6.8 / 6.2, 3)  # against native fp8 on the same card
    assert "image_speedup_vs_native-fp8" not in runs["native-fp8@resident"] or (
        runs["native-fp8@resident"]["image_speedup_vs_native-fp8"] == 1.0
    )
    report.print_images(result)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("ours-w8a8@12GB"))
    assert line.split()[1:4] == ["6.50", "6.20", "4.00"] and "1.10" in line.split()
    # a call without the peer's resident run: no floor from its own capped step, only the bus part
    alone = {"ours-w8a8@12GB": run(280.0, 6.5, [6.0, 6.2], streamed=10.0)}
    report.card_ratios({"info": {}, "runs": alone})
    assert "image_s_floor" not in alone["ours-w8a8@12GB"] and alone["ours-w8a8@12GB"]["image_s_bus_floor"] == 4.0


def test_comfy_vram_prompt_cycle_ratio_and_line(capsys):
    from comfyui_ideogram4_int8.bench.comfy import report

    def run(warm_cycle, reads):
        images = [
            {"seconds": 9.0, "steps": 20, "encode_s": 2.5, "cycle_s": 11.5, "files_read": {"safe_open": 1}},
            {"seconds": 4.0, "steps": 20, "encode_s": 0.4, "cycle_s": warm_cycle, "files_read": reads},
        ]
        return {
            "step_ms_median": 200.0,
            "images": images,
            "image_s_first": 9.0,
            "image_s_warm_median": 4.0,
            "cycle_s_first": 11.5,
            "cycle_s_warm_median": warm_cycle,
            "files_read_in_cycles": sum(reads.values()),
        }

    runs = {"native-fp8@16GB": run(9.1, {"load_torch_file": 1}), "ours-w8a8@16GB": run(6.5, {"safe_open": 0})}
    result = {"info": {"steps": 20, "images": 2}, "runs": runs}
    report.card_ratios(result)
    assert runs["ours-w8a8@16GB"]["cycle_speedup_vs_native-fp8"] == round(9.1 / 6.5, 3)
    report.print_images(result)
    out = capsys.readouterr().out
    ours = next(ln for ln in out.splitlines() if "ours-w8a8@16GB" in ln and "prompt cycle" in ln)
    native = next(ln for ln in out.splitlines() if "native-fp8@16GB" in ln and "prompt cycle" in ln)
    assert "warm 6.50 s (1.40x native fp8)" in ours and ours.endswith("files read again after the first prompt: 0")
    assert native.endswith("files read again after the first prompt: 1")


def test_e2e_prints_its_runs_and_a_failed_compiled_run_on_the_shared_table(capsys):
    """bench/e2e.py's result has the shared shape (``runs``; a compiled run that failed is an entry with ``error``)
    and prints through the shared table: the run's row under the header, the failure as FAILED with its error."""
    from comfyui_ideogram4_int8.bench import e2e

    ok = {"step_ms_median": 200.0, "step_speedup_vs_bf16": 1.5, "default20_sample_ms": 4000.0, "peak_gib": 30.0}
    ok["profile_ms"] = {"gemm": 100.0, "act-quant": 5.0, "attention": 40.0, "other": 10.0}
    info = {"gpu": "G", "torch": "t", "triton": "tr", "layers": 34, "size": "1024x1024", "text_tokens": 512}
    failed = {"compiled": "default", "error": "RuntimeError: boom"}
    e2e.print_table({"info": info, "runs": {"triton-int8": ok, "triton-int8 compiled:default": failed}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "G, torch t, triton tr, 34 blocks, 1024x1024, 512 text tokens"
    assert lines[2].startswith(f"{'path':<30}{'step ms':>9}{'x bf16':>8}")
    row = ["triton-int8", "200.0", "1.50x", "0.00x", "4.00", "100.0", "5.0", "40.0", "10.0", "30.00", "nan"]
    assert lines[3].split() == row
    assert lines[4] == f"{'triton-int8 compiled:default':<30} FAILED: RuntimeError: boom"


def _report_result():
    info = {"gpu": "NVIDIA GeForce RTX 4090", "cc": "8.9", "torch": "2.13.0", "cuda": "12.8", "triton": "3.7.1"}
    info.update(copy_gbps=880.0, command="python -m comfyui_ideogram4_int8 bench")
    pack = {"version": "0.1.0", "arch": "sm89", "family": "Ada", "gemm_path": "triton-int8", "backend": "triton"}
    pack["self_check"] = {
        "runs": "sm89 is not measured in this repository",
        "results": [
            {"family": "triton", "passed": True, "why": None, "seconds": 0.84, "from_cache": False},
            {
                "family": "fp8",
                "passed": False,
                "why": "fp8 GEMM: 3 of 9 outputs differ",
                "seconds": 0.2,
                "from_cache": False,
            },
        ],
    }
    qkv = {"shape": "qkv", "M": 4608, "N": 13824, "K": 4608, "triton-int8_gpu_ms": 0.5, "gpu_speedup_vs_bf16": 1.7}
    qkv.update({"triton-gemm-only_gpu_ms": 0.4, "gemm_gpu_speedup_vs_int_mm": 0.93, "int32_bit_exact_vs_int_mm": False})
    qkv.update(triton_config="triton/128x128x64/g8/w4/s4", triton_config_source="autotuned (412 us)")
    pair = {
        "shape": "ffn_swiglu",
        "M": 4608,
        "N": 24576,
        "K": 4608,
        "triton-int8_gpu_ms": 0.9,
        "gpu_speedup_vs_bf16": 2.0,
    }
    return {"info": info, "pack": pack, "rows": [qkv, pair], "failed": {"w2": "GemmPathUnavailable: self-check"}}


def test_the_report_to_paste_names_the_gpu_paths_self_check_and_each_shapes_ratios():
    text = gemm.report_markdown(_report_result())
    assert "RTX 4090, sm_89 (sm89: Ada)" in text and "Triton 3.7.1" in text
    assert "self-check: triton passed in 0.84 s; fp8 FAILED (fp8 GEMM: 3 of 9 outputs differ)" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    cells = [c.strip() for c in rows["qkv"].split("|")[1:-1]]
    assert cells[4:9] == ["0.500", "1.70", "0.400", "0.93", "NO"]
    assert "autotuned (412 us)" in cells[9]
    pair = [c.strip() for c in rows["ffn_swiglu"].split("|")[1:-1]]
    assert pair[5] == "2.00" and pair[6:9] == ["-", "-", "-"]  # no GEMM-alone peer for the pair: '-', not a crash
    assert "failed: GemmPathUnavailable: self-check" in rows["w2"]


def test_the_ck_attention_peer_runs_in_a_process_of_its_own(tmp_path, capsys):
    """native-fp8-ck-attention is native fp8 under ComfyUI's --use-ck-attention, which ComfyUI reads when its attention
    module is imported: it needs a process of its own (--vram), is refused in-process, and is not a default peer."""
    from comfyui_ideogram4_int8.bench.comfy import cli, peers

    assert peers.PEER_COMFY_ARGS["native-fp8-ck-attention"] == {"use_ck_attention": True}
    assert peers.PEERS["native-fp8-ck-attention"] == ("fp8", "native")
    base = ["--comfyui", str(tmp_path), "--workdir", str(tmp_path)]
    assert "native-fp8-ck-attention" not in cli.parse(base).peers
    with pytest.raises(SystemExit):
        cli.parse([*base, "--peers", "native-fp8-ck-attention"])
    assert "use --vram" in capsys.readouterr().err
    assert cli.parse([*base, "--peers", "native-fp8-ck-attention", "--vram", "0"]).peers == ["native-fp8-ck-attention"]


def _fake_children(monkeypatch, parent):
    """``parent``'s child processes replaced: each command is kept, a write job answers with its files, a peer job
    with an error entry (no GPU here); returns the kept commands."""
    import json
    import subprocess

    from comfyui_ideogram4_int8.bench.comfy import cli, peers

    commands = []

    def fake_run(cmd, **_kw):
        commands.append(cmd)
        a = cli.parse(cmd[3:])
        job = json.loads(a.child)
        if job["write"]:
            files = peers.layout_files(job["write"], pathlib.Path(a.workdir))
            answer = {"files": {b: str(f) for b, f in files.items()}}
        else:
            answer = {"peer": job["peer"], "vram_gib": job["cap"], "error": "no GPU in this test"}
        return subprocess.CompletedProcess(cmd, 0, "CHILD_RESULT " + json.dumps(answer), "")

    monkeypatch.setattr(parent.subprocess, "run", fake_run)
    monkeypatch.setattr(parent.os, "sync", lambda: None)
    return commands


def _jobs(commands):
    import json

    from comfyui_ideogram4_int8.bench.comfy import cli

    return [json.loads(cli.parse(c[3:]).child) for c in commands]


def test_comfy_decode_writes_the_vae_once_and_hands_it_to_every_peer_child(tmp_path, monkeypatch, capsys):
    """--decode: the parent writes the real-width VAE file once, before any peer runs, and each peer's child (the
    throw-away run too) gets it in its job; the writers get none, and a run without --decode hands no VAE over."""
    from comfyui_ideogram4_int8.bench.comfy import cli, parent

    base = ["--comfyui", str(tmp_path), "--workdir", str(tmp_path), "--peers", "native-fp8", "--vram", "16,8"]
    commands = _fake_children(monkeypatch, parent)
    result = parent.run(cli.parse([*base, "--decode"]))
    jobs = _jobs(commands)
    writes = [j["write"] for j in jobs if j["write"]]
    assert writes == ["vae", "fp8"]
    peer_jobs = [j for j in jobs if j["peer"]]
    assert len(peer_jobs) == 3  # the warm-up, then one a card
    assert {j["vae"] for j in peer_jobs} == {str(tmp_path / "flux2-vae.safetensors")}
    assert not any("vae" in j for j in jobs if j["write"])
    assert result["info"]["decode"] is True

    commands.clear()
    result = parent.run(cli.parse(base))
    assert not any("vae" in j for j in _jobs(commands)) and result["info"]["decode"] is False
    capsys.readouterr()


def test_comfy_decode_file_is_reused_with_reuse_files(tmp_path, monkeypatch, capsys):
    from comfyui_ideogram4_int8.bench.comfy import cli, parent

    (tmp_path / "flux2-vae.safetensors").write_bytes(b"written by an earlier run")
    commands = _fake_children(monkeypatch, parent)
    argv = ["--comfyui", str(tmp_path), "--workdir", str(tmp_path), "--peers", "native-fp8", "--vram", "8"]
    parent.run(cli.parse([*argv, "--decode", "--reuse-files", "--no-warmup"]))
    assert [j["write"] for j in _jobs(commands) if j["write"]] == ["fp8"]
    assert "[vae] using the files already in" in capsys.readouterr().out


def test_comfy_decode_needs_vram(tmp_path, capsys):
    """In-process runs do not decode: --decode without --vram is refused rather than dropped without a word."""
    from comfyui_ideogram4_int8.bench.comfy import cli

    with pytest.raises(SystemExit):
        cli.parse(["--comfyui", str(tmp_path), "--workdir", str(tmp_path), "--decode"])
    assert "--decode: decodes in the --vram runs only" in capsys.readouterr().err
    assert cli.parse(["--comfyui", str(tmp_path), "--workdir", str(tmp_path), "--decode", "--vram", "0"]).decode


def test_comfy_decode_summary_is_the_first_image_and_the_warm_medians():
    from comfyui_ideogram4_int8.bench.comfy import child

    images = [
        {"seconds": 9.0, "decode_s": 1.5, "image_decode_s": 10.5},
        {"seconds": 4.0, "decode_s": 0.4, "image_decode_s": 4.4},
        {"seconds": 5.0, "decode_s": 2.0, "image_decode_s": 7.0},
        {"seconds": 4.2, "decode_s": 0.5, "image_decode_s": 4.7},
    ]
    assert child.decode_summary(images) == {
        "image_decode_s_first": 10.5,
        "decode_s_warm_median": 0.5,
        "image_decode_s_warm_median": 4.7,
    }
    assert child.decode_summary(images[:1]) == {"image_decode_s_first": 10.5}


def test_comfy_vram_decode_ratios_and_line(capsys):
    """--decode: the image with its decode against each native peer's on the same card, and a line per run saying
    the decodes and whether one shrank the MODELs (then the next image captures and plans again)."""
    from comfyui_ideogram4_int8.bench.comfy import report

    def run(warm_with_decode, after, captures):
        images = [{"seconds": 9.0, "steps": 20, "decode_s": 1.5, "image_decode_s": 10.5, "graph_captures": 4}]
        for i, (w, gib) in enumerate(zip(warm_with_decode, after, strict=True)):
            images.append(
                {
                    "seconds": w - 0.5,
                    "steps": 20,
                    "decode_s": 0.5,
                    "image_decode_s": w,
                    "models_loaded_gib_before_decode": [5.0, 5.0],
                    "models_loaded_gib_after_decode": gib,
                    "graph_captures": captures if i else 0,
                    "plan_changes": 1 if captures else 0,
                }
            )
        return {
            "step_ms_median": 200.0,
            "images": images,
            "image_s_first": 9.0,
            "image_s_warm_median": sorted(w - 0.5 for w in warm_with_decode)[len(warm_with_decode) // 2],
            "image_decode_s_first": 10.5,
            "image_decode_s_warm_median": sorted(warm_with_decode)[len(warm_with_decode) // 2],
        }

    runs = {
        "native-fp8@8GB": run([9.0, 9.4], [[5.0, 5.0], [5.0, 5.0]], 0),
        "native-bf16@8GB": run([12.0, 12.6], [[5.0, 5.0], [5.0, 5.0]], 0),
        "ours-w8a8@8GB": run([6.0, 6.4], [[5.0, 5.0], [1.0, 5.0]], 3),
        "ours-w8a8@16GB": run([5.0, 5.2], [[5.0, 5.0], [5.0, 5.0]], 0),
    }
    result = {"info": {"steps": 20, "images": 3}, "runs": runs}
    report.card_ratios(result)
    ours = runs["ours-w8a8@8GB"]
    assert ours["image_decode_speedup_vs_native-fp8"] == round(9.4 / 6.4, 3)
    assert ours["image_decode_speedup_vs_native-bf16"] == round(12.6 / 6.4, 3)
    assert ours["image_speedup_vs_native-fp8"] == round(8.9 / 5.9, 3)  # the image alone keeps its own ratio
    assert not any(k.startswith("image_decode_speedup") for k in runs["ours-w8a8@16GB"])  # no native on 16 GB
    report.print_images(result)
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if "with decode:" in ln}
    assert set(lines) == set(runs)
    assert lines["ours-w8a8@8GB"].endswith(
        f"with decode: first 10.50 s, warm 6.40 s ({9.4 / 6.4:.2f}x native fp8, {12.6 / 6.4:.2f}x native bf16), "
        "decodes [1.5, 0.5, 0.5] s, MODELs shrunk by a warm decode: 1 of 2, warm captures / plan changes: 3 / 2"
    )
    assert "(- native fp8, - native bf16)" in lines["ours-w8a8@16GB"]
