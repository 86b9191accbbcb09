"""The loader / patch / sampler nodes inside a real ComfyUI 0.33 (skipped without COMFYUI_DIR), as in-process checks
(``comfy_nodes_script.py`` run by ComfyUI's own Python, --cpu): parity of ComfyUI's native Ideogram 4 with the pack's
ops against the reference DiT, the sampler against ``ideogram4.sample`` and against the native DualModelGuider graph,
fp8 protected layers, interruption, LoRA (full load / lowvram), smoothing folded at load, offload / clone /
state_dict, low-VRAM streaming, the staged weight upload, the branch-device and CUDA-graph nodes, the patch node, bad
inputs, progress hooks.
The fused ops in those models are in test_native_ops_comfyui.py, a real server in test_nodes_server_comfyui.py.
Synthetic weights use the demo config (128 latent channels, 4 blocks), so native Flux2 latents fit.
"""

from __future__ import annotations

import pytest
from comfy_check_run import CPU_PATHS, INT8_WHOLE_MODEL, check_runner
from host_copy_checks import assert_host_copies
from parking_checks import assert_parking
from pin_ahead_checks import assert_pin_ahead
from upload_checks import CASES, assert_upload

pytestmark = pytest.mark.comfyui


@pytest.fixture(scope="module")
def run_check(tmp_path_factory):
    return check_runner(tmp_path_factory)


def test_native_model_with_our_ops_matches_the_reference_dit(run_check):
    r = run_check("parity")
    seed = r["__seed__"]
    for fmt in ("w8a8", "int8_convrot", "fp8", "bf16"):
        for branch in ("conditional", "unconditional"):
            # every linear of ComfyUI's model, fed its own recorded input, equals the reference's linear exactly
            assert r[f"{fmt}/{branch}/layers_checked"] == 31, seed
            assert r[f"{fmt}/{branch}/layerwise_max_abs"] == 0.0, (seed, fmt, branch)
            for case in ("image_only", "conditional", "conditional_masked"):
                # whole model on the int8 path: float-rounding differences upstream may flip an activation's int8
                # rounding (1 LSB), which random tiny weights amplify to ~1e-3; anything wrong is ~1e-1 or worse
                assert r[f"{fmt}/{branch}/whole/{case}"] <= INT8_WHOLE_MODEL, (seed, fmt, branch, case)
        assert r[f"{fmt}/int8_weights"] >= 23, seed
    summary = r["w8a8/summary"]
    assert "conditional: i4_w8a8.safetensors" in summary and "unconditional: i4_w8a8.safetensors" in summary
    assert f"GEMM paths: {CPU_PATHS}" in summary  # the panel's words for this device, with the path ids
    # the attention line names what runs on the load device (a CPU here: ComfyUI's own attention, not cuDNN)
    assert "attention: ComfyUI's own on the CPU" in summary and "cuDNN is ~2x" not in summary
    assert "bf16-protected layers (2): layers.1.feed_forward.w2, layers.3.feed_forward.w2" in summary
    assert "quantized to W8A8 on load: 25 layers" in r["fp8/summary"]
    assert "ConvRot layers: 21" in r["int8_convrot/summary"]
    assert r["paths_dequant"]["dequant-bf16"] == 23 and r["paths_dequant"]["bf16"] == 8
    for case in ("image_only", "conditional", "conditional_masked"):
        # fp32, no activation quantization: ComfyUI's stock ops are bit-identical, the reference DiT within 1e-3
        assert r[f"float/vs_stock/{case}"] <= 1e-6, (seed, case)
        assert r[f"float/vs_reference/{case}"] <= 1e-3, (seed, case)
        assert r[f"dequant/whole/{case}"] <= INT8_WHOLE_MODEL, (seed, case)
    assert r["float_paths"]["bf16"] == 31


def test_sampler_node_equals_reference_sampler_and_native_graph(run_check):
    r = run_check("sampler")
    seed = r["__seed__"]
    assert r["float/vs_sample"] <= 1e-5, seed  # the loop itself: ideogram4.sample, same models, same seed
    assert r["int8/vs_sample"] <= INT8_WHOLE_MODEL, seed  # W8A8 path: activation-rounding flips only
    assert r["int8/vs_reference_dit"] <= INT8_WHOLE_MODEL, seed
    assert r["int8/shape"] == [1, 128, 16, 16]
    assert r["int8/other_seed_diff"] > 0.1, seed
    # DualModelGuider (negative unconnected) + Ideogram4Scheduler + SamplerCustomAdvanced, constant guidance
    assert r["native_graph_max_abs"] == 0.0, seed
    assert r["native_graph_norm"] > 0
    for name, steps in (("Quality 48", 48), ("Default 20", 20), ("Turbo 12", 12)):
        assert r[f"preset/{name}/calls"] == steps
        assert r[f"preset/{name}/guidance_ok"] is True, name
        assert r[f"preset/{name}/sigma_max_abs"] <= 1e-6, name


def test_protected_layers_in_fp8_run_the_fp8_path_within_fp8s_error(run_check):
    """protected_layers = fp8: the W8A8 file's bf16 w2 load as ComfyUI float8_e4m3fn weights (one scale each), run
    the fused FP8 GEMM (the interpreter here), within fp8's activation rounding of the same weights dequantized; a
    forced dequant-bf16 runs exactly those weights, labelled; saved back in ComfyUI's fp8 form; a smaller model."""
    r = run_check("protected_fp8")
    seed = r["__seed__"]
    assert len(r["protected"]) == 2 and r["fp8_weights"] == [True, True] and r["fp8_scales"] == [1, 1]
    assert r["plain_paths"] == ["bf16"] and r["plain_recorded"] == 2
    assert r["fp8_paths"] == ["triton-fp8"] and r["fp8_recorded"] == 2 and r["fp8_reasons"] == [""]
    assert r["fp8_forced_paths"] == ["bf16"]
    assert r["fp8_forced_reasons"] == ["fp8 weight dequantized: forced by the GEMM path widget (dequant-bf16)"]
    assert sorted(r["rel_forced"]) == sorted(r["protected"])
    for layer, err in r["rel_forced"].items():  # per layer, on the same input
        assert err <= 1e-6, (seed, layer)
    for case, err in r["rel_fp8"].items():
        assert 0 < err <= 0.03, (seed, case)  # e4m3 activation rows on 2 of 4 blocks' w2
    assert r["fp8_summary_fp8_line"] and not r["plain_summary_fp8_line"]
    assert r["saved_format"] == "float8_e4m3fn" and r["saved_dtype"] == "torch.float8_e4m3fn"
    assert r["fp8_bytes"] < r["plain_bytes"]
    # the bypass check counts the fp8 layers as layers the op must run, and names one routed around it
    cov = r["coverage"]
    assert cov["missing"] == [] and cov["ran"] == cov["expected"] == len(r["linears_checked"])
    assert set(r["protected"]) <= set(r["linears_checked"])
    assert r["bypass_missing"] == [r["protected"][0]]
    # a LoRA merged in full-load mode: requantized to fp8 (within e4m3's rounding of W + delta), same path, undone
    assert r["lora_fp8"] is True and r["lora_path"] == "triton-fp8"
    assert r["lora_merged_vs_w_plus_delta"] <= 0.06 < r["lora_w_vs_w_plus_delta"], seed  # ComfyUI rounds stochastically
    assert r["after_unpatch_vs_w"] == 0.0, seed


def test_interrupting_a_run_leaves_the_models_usable(run_check):
    r = run_check("interrupt")
    assert r["interrupted"] is True
    assert r["steps_before_interrupt"] == 3
    assert r["leftover_weight_functions"] == []
    assert r["rerun_max_abs"] == 0.0
    assert r["clean_norm"] > 0


def test_lora_on_a_smoothed_int8_layer_full_load_and_lowvram(run_check):
    r = run_check("lora")
    seed = r["__seed__"]
    assert r["smoothed"] is True
    assert r["unpatched_vs_patched_ref"] > 0.02, seed  # the patch matters
    # full load: merged into the real W (smoothing undone first), requantized, still on the int8 path
    assert r["full_load_int8"] is True and r["full_load_path"] == "cublas-int8"
    assert r["merged_weight_vs_w_plus_delta"] <= 0.05 < r["w_vs_w_plus_delta"], seed
    assert r["full_load_vs_ref"] <= 0.25 * r["unpatched_vs_patched_ref"], seed
    assert r["after_unpatch_vs_unpatched"] <= 1e-5, seed
    # lowvram: applied on the fly to the dequantized real W, a labelled float GEMM, exact against the reference
    assert r["lowvram_cast_modules"] == 31 and r["lowvram_weight_function"] == 1
    # the LoRA'd layer itself is a float GEMM on both sides (exact layer by layer); the model around it is not: the
    # native model folds the smoothing into attention_norm1, the reference (whose qkv is a float layer) does not, so
    # the int8 activations downstream round differently now and then. Over 18 seeds: 10 within 2e-6 of the patch's
    # effect, the others 0.1-2.4% (the earlier 1% bound failed CI twice); a patch not applied is off by 100%
    assert r["lowvram_vs_ref"] <= 0.05 * r["unpatched_vs_patched_ref"], seed
    assert r["lowvram_path"] == "bf16" and "LoRA" in r["lowvram_reason"]
    assert r["after_lowvram_vs_unpatched"] <= 1e-5, seed


def test_smoothing_folded_at_load_with_lora_and_lowvram(run_check):
    """transformerlab layout with a SmoothQuant vector on every quantized layer (w1 / w3 different): the loader folds
    them (default one shared w1/w3 vector; 'ratio'; 'off' = as stored), LoRA and lowvram stay right."""
    r = run_check("smooth")
    seed = r["__seed__"]
    assert r["qkv_folded"] and r["off_divides_by_s"] and r["ratio_w3_divides"]
    assert r["norm_fold_rel"] <= 1e-7  # attention_norm1's weight / s, in the fp32 compute dtype
    assert r["v_rows_linked"] and r["norm_linked"] and r["w3_rows_linked"]  # producers know their folds (LoRA)
    # dividing quantizer passes per forward: every smoothed layer unfolded; the one-row layers (adaln_modulation x4,
    # t_embedding.mlp_out, adaln_proj) folded; plus w3's ratio divide per block in 'ratio' mode
    assert r["divides"] == {"off": 25, "ratio": 10, "min": 6}, r["divides"]
    for k in ("off", "ratio", "min"):
        assert r["divides"][k] == r[f"divides_expected/{k}"]
    assert r["ratio_vs_off"] <= INT8_WHOLE_MODEL and r["min_vs_off"] <= INT8_WHOLE_MODEL, seed
    assert "SmoothQuant divide folded at load, none at run time: 19 layers" in r["summary_min"]
    assert "8 weights re-quantized to one shared vector (mode 'min'" in r["summary_min"]
    assert "SmoothQuant divide kept at run time: 6 layers" in r["summary_min"] and "SiLU" in r["summary_min"]
    assert "folding off; every smoothed layer (25) divides its input at run time" in r["summary_off"]
    assert "a divide by a ratio left at run time: 4 layers" in r["summary_ratio"]
    assert "SmoothQuant divide at run time: its input is SiLU" in r["note_adaln"]
    assert "SmoothQuant" not in r["note_qkv"]
    # LoRA on every kind of folded layer and on the norms that carry folds
    assert r["lora_effect"] > 0.02, seed
    for k in ("off", "ratio", "min"):
        assert r[f"{k}/full_int8"] is True, k  # merged and requantized: still on the int8 path
        assert r[f"{k}/after_unpatch"] == 0.0 and r[f"{k}/after_lowvram"] == 0.0, k
        assert r[f"{k}/lowvram_paths"] == ["bf16"], k  # patched layers: labelled float GEMMs
    # layer by layer (each patched layer of the folded model on the input it expects, its folded output rows
    # multiplied back, against the unfolded model's): merged weights and outputs equal up to float rounding, in
    # full load (int8 path) and lowvram (float path); 'min' re-quantized w1 / w3, so those two are left out there
    # 'ratio' re-quantizes the merged weights from a real W rebuilt through other folds than 'off' does: an element
    # on a rounding boundary lands one int8 step apart (1e-7 when none does; 6e-5 to 6e-4 on 4 of 7 seeds, which
    # failed the earlier 1e-5 / 1e-4 about every second run; 'min' too, rarely: 8.3e-5 at seed 13643988); a LoRA
    # merged into the folded weights is off by > 2e-2
    merged_bound = {"ratio": 2e-3, "min": 2e-3}
    for k in ("ratio", "min"):
        assert r[f"{k}/merged_vs_off"] <= merged_bound[k], (k, seed)
        assert r[f"{k}/full_layerwise_vs_off"] <= max(1e-4, merged_bound[k]), (k, seed)
        assert r[f"{k}/lowvram_layerwise_vs_off"] <= 1e-5, (k, seed)
        assert r[f"{k}/lowvram_norm_patched"] is True, k
    # whole model: float-rounding differences upstream flip rare activation roundings (amplified by random tiny
    # weights, up to ~7e-3 seen elsewhere); 'min' also differs by its re-quantized w1 / w3. A wrong fold or a LoRA
    # applied to the folded instead of the real weights moves the output by the LoRA's own effect or more.
    for k in ("ratio", "min"):
        assert r[f"{k}/full_vs_off"] <= 0.2 * r["lora_effect"], (k, seed)
        assert r[f"{k}/lowvram_vs_off"] <= 0.2 * r["lora_effect"], (k, seed)
    assert r["saved_max_abs"] == 0.0, seed
    assert "attention.qkv ×4 into attention_norm1's weight (folded before saving)" in r["summary_saved"]


def test_offload_clone_reinit_and_state_dict_round_trip(run_check):
    r = run_check("offload")
    assert 0 < r["model_size"] < 0.5 * r["float_size"]
    assert r["cast_modules"] > 31  # linears, norms, embedding cast per call
    assert r["lowvram_max_abs"] == 0.0 and r["lowvram_qkv_path"] == "cublas-int8"
    assert r["clone_max_abs"] == 0.0
    assert r["reinit_max_abs"] == 0.0 and r["reinit_is_new_model"] is True
    assert r["after_to_int8"] is True
    assert r["state_dict_smooth_keys"] == 13 and r["state_dict_quant_keys"] == 23
    assert r["saved_max_abs"] == 0.0


def test_low_vram_streaming_equals_resident(run_check):
    r = run_check("streaming")
    assert r["patcher"] == "Ideogram4ModelPatcher"
    assert len(r["streamed"]) == 3 and r["loaded_within_budget"] and r["model_lowvram"]
    assert r["max_abs_vs_resident"] == 0.0  # same kernels on the streamed copy: bit for bit
    assert r["streamed_layers_recorded"] >= 5 and r["same_paths"]
    assert r["streamed_ffn_fused_calls"] == 1 + 3  # fused resident, then in each streamed forward too
    assert r["unbound_after_forward"] and r["mispredicted"] == 0
    # three pieces per streamed block in call order, each released as the next binds; w1|w3 bound together, unhooked
    assert r["units"] == [[i, p] for i in r["streamed"] for p in ("attention", "gate_up", "down")]
    assert r["pieces_in_order"] and r["pair_hooks"] == 0
    assert r["read_from_slot"] == dict.fromkeys(("adaln_modulation", "qkv", "o", "w1", "w3", "w2"), True)
    assert r["piece_modules"] == {
        "attention": ["attention.qkv", "attention.o", "adaln_modulation"],
        "gate_up": ["feed_forward.w1", "feed_forward.w3"],
        "down": ["feed_forward.w2"],
    }
    # three slots of the largest piece, smaller than a slot of the largest block
    assert r["slots"] == 3 and r["slot_bytes"] == r["largest_piece"] < r["largest_block"]
    assert r["note"].startswith("low-VRAM streaming:") and "3 streamed as 9 pieces through 3 slots of" in r["note"]
    assert r["report"]["streamed_blocks"] == 3 and r["report"]["forwards"] == 3
    assert r["report"]["pieces"] == 9 and r["report"]["slots"] == 3
    assert r["report"]["slot_mib"] == round(r["largest_piece"] / 2**20, 3)
    # CUDA graphs may capture a streamed pass (its copies with it), unless a weight streams from pageable memory
    if r["pageable"]:
        assert "pageable memory" in r["graphs_off_reason"], r["graphs_off_reason"]
    else:
        assert r["graphs_off_reason"] is None
    assert r["fingerprint_streaming"] and r["fingerprint_host_weights"]
    # the experiment stream-whole-blocks: whole blocks through two slots, the same latent, the pair still fused
    w = r["whole"]
    assert w["units"] == [[i, "block"] for i in w["streamed"]] and len(w["streamed"]) == 3 and w["in_order"]
    assert w["slots"] == 2 and w["slot_bytes"] == w["largest_block"] == r["largest_block"]
    assert w["max_abs"] == 0.0 and w["fused_calls"] == 2 and w["mispredicted"] == 0
    assert w["report"]["pieces"] == 3 and w["report"]["slots"] == 2
    assert r["old_slots"] > 0 and r["old_slots_alive"] == 0
    assert r["freed_positive"] and r["streamed_after_unload"] == 4 and r["max_abs_after_unload"] == 0.0
    assert r["stream_after_unpatch"]
    assert r["lora_streamed"] and r["lora_changed_output"] > 1e-3
    assert r["lora_max_abs_vs_full_load"] == 0.0
    assert r["restored_after_unpatch"]
    assert r["uncond_first_resident"] and r["uncond_streams_after_rebalance"]
    assert r["cond_streamed_after_rebalance"] < 4 and r["max_abs_rebalanced"] == 0.0 and r["within_pool"]
    # llm_cond_proj stays on the host for the image-only branch only, and still computes when called (cast)
    hb = r["host_bytes"]
    assert hb["uncond"] == hb["llm_cond_proj"] > 0 and hb["cond_layers"] == 0
    assert r["uncond_host_layer_cast"] and "unused layers left on the host" in r["uncond_plan_note"]
    assert r["max_abs_uncond_streamed"] == 0.0 and r["max_abs_uncond_text_streamed"] == 0.0
    assert r["uncond_host_layer_back"]
    tg = r["together"]
    assert tg["first_streams"] and tg["first_kept"] and tg["second_streams"] and tg["within"], tg
    assert tg["max_abs"] == 0.0 and tg["left_after"] == {}
    lt = r["load_together"]
    assert lt["loaded"] and lt["calls"] == 2 and lt["models"] == [True, True]
    # MODELs not on the card yet come parked with all their bytes: ComfyUI is asked no room for them (their load
    # takes it from the dynamic models' pages); on the card already, or park=off: not parked, as ComfyUI counts them
    fresh = [[True, 0], [True, 0]]
    assert lt["fresh"][0] == fresh and lt["fresh"][2] == fresh and lt["fresh"][3] == fresh, lt["fresh"]
    assert [p for p, _ in lt["fresh"][1]] == [False, False]
    assert [p for p, _ in lt["fresh"][-1]] == [False, False] and all(r > 0 for _, r in lt["fresh"][-1])
    assert lt["parked_after_failure"] == [0, 0]
    assert lt["per_pass_estimate"] > 0
    # with CUDA graphs on, a first load leaves room for their pool as a share of the pass's estimate; a later run
    # does not ask it
    assert 0 < lt["graph_share"] <= 2
    share = 1 + lt["graph_share"] if lt["graphs_on"] else 1.0
    assert lt["memory_required"] == lt["minimum_memory_required"]
    assert lt["memory_required"] == pytest.approx(lt["per_pass_estimate"] * share + lt["margin"])
    assert lt["later_memory_required"] == pytest.approx(lt["per_pass_estimate"] + lt["margin"])
    # a pool measured at its last release, larger than the share, is left free instead (graphs on)
    pool = lt["per_pass_estimate"] * (3 if lt["graphs_on"] else 1) + lt["margin"]
    assert lt["pool_memory_required"] == pytest.approx(pool)
    # inside the pack's sampler: one batch per branch pass (half the doubled request), restored after
    assert lt["one_batch_estimate"] * 2 == pytest.approx(lt["per_pass_estimate"])
    assert lt["inside_memory_required"] == pytest.approx(lt["one_batch_estimate"] * share + lt["margin"])
    assert lt["inside_estimate"][0] == pytest.approx(lt["one_batch_estimate"]) and lt["inside_factor_ratio"] == 0.5
    assert lt["comfyui_env_estimate"][0] == pytest.approx(lt["per_pass_estimate"])
    assert lt["factor_restored"]
    assert "at least" in r["insufficient"] and "GiB" in r["insufficient"]


def test_resident_weights_go_up_in_one_staged_copy(run_check):
    r = run_check("upload")
    # the CPU stands in for the card: the pack's loads ran the staged plan with host copies (an upload to a CPU is
    # otherwise a .to that copies nothing); ComfyUI's own move under upload=comfyui copied nothing
    assert_upload(r, "host-twin")
    assert r["device"] == "cpu" and "host (the CPU twin) staging buffers" in r["pack"]["full"]["note"]
    assert all(r["comfyui"][case]["copied_planned"] == 0 for case in CASES)
    assert r["pack"]["lora"]["copied_other"] == 1  # the patched weight, merged by ComfyUI in both modes


def test_branch_device_node_and_concurrent_passes(run_check):
    r = run_check("branch_device")
    # no second GPU here (--cpu): the node returns the MODEL unchanged and says why, on the panel too
    for choice in ("second GPU", "cuda:3"):
        assert r[f"{choice}/same_object"], choice
        assert "both branches on cpu" in r[f"{choice}/note"] and "needs CUDA" in r[f"{choice}/note"]
    assert r["panel_note"] == r["cuda:3/note"]
    assert "'device'" in r["bad_choice"] and "cuda:9" in r["bad_choice"]
    # the unconditional pass in ComfyUI's worker thread, the conditional one in the sampler's: same latent
    assert r["threads"] == {"conditional": [True], "unconditional": [False]}
    assert r["concurrent_max_abs"] == 0.0
    assert r["worker_error"] == "unconditional pass failed on purpose" and r["after_error_max_abs"] == 0.0
    assert "runs on cpu but its pass got the input on meta" in r["guard"] and "Ideogram 4 Sampler" in r["guard"]
    assert r["wrapper"] == {"devices": ["cpu", "cpu", "cpu"], "out": [2.0, 2.0]}


def test_cuda_graph_wrapper_goes_on_the_packs_models_for_one_run(run_check):
    r = run_check("cuda_graphs")
    key = "ideogram4_int8_cuda_graphs"
    # on the pack's MODELs (each once) for the run, never on ComfyUI's own MODEL; off after, also after a failure
    assert r["during"] == {"cond": [key], "uncond": [key], "native": []}
    assert r["labels"] == ["conditional", "unconditional"]
    assert r["after"] == {"cond": [], "uncond": []} and r["after_failure"] == {"cond": [], "uncond": []}
    reasons = r["reasons"]
    # the run: off when switched off, on by default and when asked for
    assert reasons["env_off"] == "IDEOGRAM4_INT8_CUDA_GRAPHS=0"
    assert reasons["env_on"] is None and reasons["default"] is None
    # graphs kept between runs go when ComfyUI moves the weights, not when it detaches the MODEL to load it again;
    # while they live, their pool's bytes are in ComfyUI's reserved VRAM
    retry = "a capture with no warm-up under these weights failed (RuntimeError: a one-time copy): one eager pass first"
    assert r["retry_notes"][0].startswith("CUDA graphs: 10 of 12 passes replayed (1 captured, 1 eager)")
    assert r["retry_notes"][0].endswith(f"; {retry}") and r["retry_notes"][1] == f"CUDA graphs: {retry}"
    release = r["release"]
    held = 5 << 20
    assert release["detach_for_reload"] == {
        "reserved_while_held": held,
        "graphs_after": 1,
        "reserved_after": held,
        "counted": held,
    }
    for case in ("partially_unload", "unpatch", "detach"):
        assert release[case] == {"reserved_while_held": held, "graphs_after": 0, "reserved_after": 0, "counted": 0}
    assert release["reserved_end"] == 0
    # during the pack's own run the pool is the passes' activations: out of the reserve, back after
    assert release["reserved_in_run"] == 0 and release["reserved_after_run"] == held
    # a pass: another node's block patches, torch.compile, the panel's timing
    assert reasons["pass_plain"] is None
    assert "patches_replace" in reasons["patches"] and reasons["empty_patches"] is None
    assert "torch.compile" in reasons["compile"] and "timing" in reasons["timing"]
    # a CPU run: no graphs and nothing to say about them
    assert r["cpu_note"] is None and r["cpu_finite"]


def test_patch_node_converts_native_models(run_check):
    r = run_check("patch")
    seed = r["__seed__"]
    for fmt in ("int8_convrot", "fp8", "bf16"):
        assert r[f"{fmt}/int8_layers"] == 25, fmt
        assert r[f"{fmt}/repatch_same_object"] is True
        for case in ("image_only", "conditional", "conditional_masked"):
            assert r[f"{fmt}/{case}/vs_reference"] <= INT8_WHOLE_MODEL, (seed, fmt, case)  # same int8 operands
            # against the source MODEL as ComfyUI runs it (its own int8 kernel / fp8 / float): quantization error
            assert r[f"{fmt}/{case}/vs_native"] <= 0.1, (seed, fmt, case)
    assert "int8 layers used as stored: 25" in r["int8_convrot/report"]
    assert "quantized to W8A8 on load: 25 layers" in r["fp8/report"]
    assert "quantized to W8A8 on load: 25 layers" in r["bf16/report"]
    assert r["lora_patches_kept"] == 1
    # the carried-over LoRA is applied once (not twice): the patched model is as close to the native LoRA model
    # as W8A8 allows, far closer than the model without the LoRA
    assert r["lora_patched_vs_native_lora"] <= 0.1 and r["lora_native_vs_plain"] > 2 * r["lora_patched_vs_native_lora"]
    for fmt in ("int8_convrot", "fp8", "bf16"):
        assert r[f"{fmt}/reinit_max_abs"] <= 1e-5, fmt  # cached_patcher_init rebuilds the same model


def test_bad_inputs_give_errors_that_say_what_to_do(run_check):
    r = run_check("bad_inputs")
    assert "not an Ideogram 4 diffusion model" in r["wrong_kind"] and "text encoders, VAEs" in r["wrong_kind"]
    assert "truncated" in r["truncated"] and "download the file again" in r["truncated"]
    assert "'unconditional_weights'" in r["single_branch_no_uncond"]
    assert "missing" in r["missing_base"] and "base" in r["missing_base"]
    assert "unconditional branch" in r["second_branch_fails"] and "layers.2.attention.o" in r["second_branch_fails"]
    assert "invalid values" in r["second_branch_fails"]
    assert r["registry_after_failed_load"] == []
    assert "hf_repo_id" in r["hf_empty"]
    assert "HF_HUB_OFFLINE is set" in r["hf_offline_missing"] and "someone/ideogram-4-int8" in r["hf_offline_missing"]
    assert "triton-int8" in r["forced_triton_on_cpu"] and "auto" in r["forced_triton_on_cpu"]
    ram = r["too_little_ram"]
    assert ram.startswith("ValueError: Ideogram 4 INT8 Loader: not enough free system memory"), ram
    assert "0.5 GB free (RAM + swap)" in ram and "at least 1.1 GB free" in ram and "close other programs" in ram
    patch_ram = r["patch_too_little_ram"]  # the Patch node builds its W8A8 copy next to the source MODEL's weights
    assert patch_ram.startswith("ValueError: Ideogram 4 INT8 Patch: the MODEL's weights cannot be converted: "), (
        patch_ram
    )
    assert "not enough free system memory (RAM) to patch this branch" in patch_ram and "0.5 GB free" in patch_ram
    assert "Ideogram 4 INT8 Loader instead" in patch_ram
    assert r["free_host_positive"]
    for key in ("patch_non_ideogram", "sampler_non_ideogram", "sampler_non_ideogram_negative"):
        assert "not an Ideogram 4 diffusion model" in r[key] and "Ideogram 4 INT8 Loader" in r[key], key
    assert "'model_negative'" in r["sampler_non_ideogram_negative"]
    for key in ("sampler_clip_l_conditioning", "sampler_zero_out_none"):
        assert "CLIPLoader of type ideogram4" in r[key], key
    assert "[1, 77, 768]" in r["sampler_clip_l_conditioning"]
    assert "multiple of 16" in r["size_not_multiple"] and "992 or 1008" in r["size_not_multiple"]
    assert "width=2048 and height=320 make an aspect ratio of 6.40:1" in r["size_aspect"]
    assert "256..2048" in r["size_small"]
    assert "polish_steps=6 is more than steps=4" in r["custom_polish_too_many"]
    assert r["with_base_ok"] is None


def test_progress_and_panel_hooks(run_check):
    r = run_check("hooks")
    assert r["load_updates"] >= 2 and r["load_monotonic"] is True
    assert r["load_last"][0] == r["load_last"][1] > 0  # the bar ends full
    assert r["sample_updates"][-1] == [3, 3]
    assert r["events"] == [["load", ["conditional", "unconditional"]], ["run", ["conditional", "unconditional"]]]
    assert r["survived_broken_publish"] is True


def test_an_unload_drops_the_card_copies_of_kept_host_tensors(run_check):
    assert_host_copies(run_check("host_copies"))


def test_a_streamed_weight_in_its_file_mapping_is_copied_before_it_is_pinned(run_check):
    r = run_check("file_pages")
    assert r["real_on_cpu"] is False  # nothing pins on a CPU: no copy there
    copy, refused, in_place, off = r["copy"], r["copy_refused"], r["in_place"], r["pinning_off"]
    for case in (copy, refused, in_place, off):
        # safetensors hands the weights out in a private mapping of the file; the plan streams two blocks and
        # computes as the resident model, every weight with its bytes as loaded
        assert all(case["mapped_before"]) and len(case["streamed"]) == 2, case
        assert all(case["same_bytes"]) and all(case["kept_is_weight"]) and case["max_abs"] == 0.0, case
    # copied: the streamed weights left the mapping (their kept host copies are the copies); pin-copy=off: in place
    # (the resident weights are on the card: here the CPU twins of the staged upload)
    assert not any(copy["mapped_after"][i] for i in copy["streamed"]), copy
    assert all(in_place["mapped_after"][i] for i in in_place["streamed"]), in_place
    # a copy that does not pin is dropped: the weight stays on the file's pages (the kernel may drop and reread them)
    assert all(refused["mapped_after"][i] for i in refused["streamed"]), refused
    # each pin through ComfyUI's pin_memory, on the calling thread, under the pack's lock; each pinned tensor
    # recorded for its unpin
    assert copy["pins_asked"] == refused["pins_asked"] == in_place["pins_asked"] > 0
    assert copy["pin_threads"] == ["MainThread"] and all(copy["pins_under_lock"]), copy
    assert copy["pinned_recorded"] == copy["pins_asked"] and refused["pinned_recorded"] == 0, refused
    # ComfyUI's pinning off: nothing asked, nothing copied, the streamed weights stay on the file's pages
    assert off["pins_asked"] == 0 and off["pinned_recorded"] == 0, off
    assert all(off["mapped_after"][i] for i in off["streamed"]), off
    assert r["reentrant"] is True
    assert r["parsed"] == [[0x7F0000000000], [0x7F0000100000]]  # private file mappings only
    assert r["fresh_tensor"] is False and r["empty_tensor"] is False


def test_a_model_unloaded_whole_takes_back_its_room_from_dynamic_models_pages(run_check):
    assert_parking(run_check("parking"))


def test_host_weights_are_pinned_ahead_of_the_first_load_and_taken_by_it(run_check):
    assert_pin_ahead(run_check("pin_ahead"), gpu=False)
