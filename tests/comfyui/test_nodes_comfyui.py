"""The loader / patch / sampler nodes inside a real ComfyUI 0.33 (skipped without COMFYUI_DIR).

Two kinds of tests:
* in-process checks (``comfy_nodes_script.py`` run by ComfyUI's own Python, --cpu): parity of ComfyUI's native
  Ideogram 4 with the pack's ops against the reference DiT, the sampler against ``ideogram4.sample`` and against
  the native DualModelGuider graph, interruption, LoRA (full load / lowvram), offload / clone / state_dict, the
  patch node, bad inputs;
* a real server with the pack (and a test-only node pack that loads conditioning from a file): /object_info,
  graphs queued through /prompt, POST /interrupt mid-run, bad inputs that must not take the server down.
Synthetic weights use the demo config (128 latent channels, 4 blocks), so native Flux2 latents fit.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
import urllib.request

import pytest
import torch
from comfy_check_run import link_pack, run_nodes_check
from workflow_models import loader_node

pytestmark = pytest.mark.comfyui

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE_IDS = ("Ideogram4Int8Loader", "Ideogram4Int8Patch", "Ideogram4Int8Sampler")
# Whole-model comparisons on the int8 path: two implementations that differ by float rounding (1e-7) upstream of a
# linear can flip one activation's int8 rounding (1 LSB); random tiny weights amplify that to 1e-4..7e-3 (seen over
# many seeds). Exactness is checked layer by layer (identical outputs) and on the float path (<= 1e-6); this bound
# only has to catch real mistakes (wrong smoothing, scale or packing: relative errors of 1e-1 and more).
INT8_WHOLE_MODEL = 5e-2


# -- in-process checks -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_check(tmp_path_factory):
    pack_parent = link_pack(tmp_path_factory.mktemp("pack"))

    def run(check: str) -> dict:
        return run_nodes_check(check, pack_parent, tmp_path_factory.mktemp(check))

    return run


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
    assert "cublas-int8 23, bf16 8" in summary
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
    for case, err in r["rel_forced"].items():
        assert err <= 1e-6, (seed, case)
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
    lt = r["load_together"]
    assert lt["loaded"] and lt["calls"] == 2 and lt["models"] == [True, True]
    assert lt["per_pass_estimate"] > 0
    assert lt["memory_required"] == lt["minimum_memory_required"] == lt["per_pass_estimate"] + lt["margin"]
    # inside the pack's sampler: one batch per branch pass (half the doubled request), restored after
    assert lt["one_batch_estimate"] * 2 == pytest.approx(lt["per_pass_estimate"])
    assert lt["inside_memory_required"] == pytest.approx(lt["one_batch_estimate"] + lt["margin"])
    assert lt["inside_estimate"][0] == pytest.approx(lt["one_batch_estimate"]) and lt["inside_factor_ratio"] == 0.5
    assert lt["comfyui_env_estimate"][0] == pytest.approx(lt["per_pass_estimate"])
    assert lt["factor_restored"]
    assert "at least" in r["insufficient"] and "GiB" in r["insufficient"]


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


def test_gate_up_pair_runs_as_one_fused_call_in_native_models(run_check):
    """Each block's w1|w3 runs as ONE call with one activation quantization (kernels.swiglu_w8a8_pair) in ComfyUI's
    own model: module tree and state-dict keys stay native; the output equals the two modules' own forwards exactly
    (fp32); different SmoothQuant vectors split (labelled) and say why; every split reason names its cause; a partial
    (lowvram) load keeps the fused call and the output. The transformerlab layout (w1 and w3 with different vectors)
    fuses once the load folds one shared vector (the default, 'w8a8_min') and splits under w1/w3 mode 'ratio'."""
    r = run_check("gate_up")
    seed = r["__seed__"]
    for fmt, fused in (
        ("w8a8_shared", True),
        ("int8_convrot", True),
        ("fp8", True),
        ("w8a8", False),
        ("w8a8_min", True),
    ):
        quantized = r[f"{fmt}/coverage"]["expected"]
        assert r[f"{fmt}/gate_up_modules"] == 4 and r[f"{fmt}/children"] == ["w1", "w2", "w3"], fmt
        assert r[f"{fmt}/native_keys"] is True, fmt
        assert r[f"{fmt}/coverage"]["ran"] == quantized and r[f"{fmt}/uncond_coverage"]["missing"] == [], fmt
        assert r[f"{fmt}/fused_vs_split_max_abs"] == 0.0, (seed, fmt)  # the same int8 operands, the same float32 ops
        assert r[f"{fmt}/vs_reference_dit"] <= INT8_WHOLE_MODEL, (seed, fmt)
        assert len(r[f"{fmt}/summary"]) == 2, fmt  # one line per branch in the loader's summary
        if fused:
            assert all(ln.endswith("SwiGLU epilogue): 4/4 blocks") for ln in r[f"{fmt}/summary"]), r[f"{fmt}/summary"]
            assert r[f"{fmt}/fused_calls"] == [1] * 4 and r[f"{fmt}/split_calls"] == [0] * 4, fmt
            assert r[f"{fmt}/quantizer_passes"] == quantized - 4, fmt  # one quantization per w1|w3 pair
            assert r[f"{fmt}/w1_fusion"].startswith("gate/up pair: one activation quantization"), fmt
            assert r[f"{fmt}/last_split"] is None
        else:  # the transformerlab layout, w1/w3 mode 'ratio': w3 divides by a ratio of the two vectors at run time
            assert r[f"{fmt}/fused_calls"] == [0] * 4 and r[f"{fmt}/quantizer_passes"] == quantized
            assert all(
                ": 0/4 blocks; as two linears: 4 blocks (w1 and w3 divide their input by different SmoothQuant" in ln
                for ln in r[f"{fmt}/summary"]
            ), r[f"{fmt}/summary"]
            assert "different SmoothQuant vectors" in r[f"{fmt}/last_split"]
            assert r[f"{fmt}/w1_fusion"].startswith("not fused with w3: w1 and w3 divide their input by different")
            assert "w1|w3 not fused: w1 and w3 divide their input by different" in r[f"{fmt}/w3_reason"]
    assert "ConvRot" in r["int8_convrot/w3_reason"]  # the rotation stays a separate op, once for both
    assert r["bf16/dtype"] == "torch.bfloat16" and r["bf16/fused_calls"] == [1] * 4
    assert r["bf16/fused_vs_split"] <= INT8_WHOLE_MODEL, seed  # one rounding of silu(g) * u instead of three
    reasons = r["reasons"]
    assert reasons["ok"] is None and reasons["smooth_restored"] is None
    assert "offloaded" in reasons["offloaded"] and "DynamicVRAM" in reasons["streamed"]
    assert "forward hooks" in reasons["hooked"] and "LoRA" in reasons["patched"]
    assert "full-precision" in reasons["full_precision"] and "different SmoothQuant" in reasons["smooth_changed"]
    assert r["lowvram_cast_w1"] is True and r["lowvram_fused"] == 1 and r["lowvram_max_abs"] == 0.0


def test_q_k_norm_and_rope_run_the_pack_kernel_in_native_models(run_check):
    """Every block's attention runs q/k RMSNorm + RoPE through kernels.qk_norm_rope (nodes/qk_rope.py), equal to
    ComfyUI's own forward to rounding (fp32) and close in bf16; the tables it reads are ComfyUI's rotation; the
    env switch runs ComfyUI's exactly, and the model note says which ran."""
    r = run_check("rope")
    seed = r["__seed__"]
    # tol: the attention's output after ``o`` (its int8 activation quantization magnifies a one-ulp difference of q
    # or k); q_tol: q itself against float64, where the pack's kernel (one rounding) is at least as close as ComfyUI's
    for dtype, tol, q_tol in (("fp32", 1e-5, 1e-6), ("bf16", 3e-2, 3e-3)):
        assert r[f"{dtype}/swapped"] == [True] * 4, dtype
        assert r[f"{dtype}/kernel_calls"] == 2 * 4, dtype  # q and k of each of the 4 blocks
        # the CPU: the pack's op runs its pure-torch twin (no Triton kernel there), and the note says so and why
        assert r[f"{dtype}/note"].startswith(r["twin_note"] + ": "), (dtype, r[f"{dtype}/note"])
        assert "CUDA" in r[f"{dtype}/note"] and "pack's fused kernel" in r["fused_note"], dtype
        assert r[f"{dtype}/matrix_is_rotation"] is True, dtype
        assert r[f"{dtype}/vs_comfyui"] <= tol, (seed, dtype, r[f"{dtype}/vs_comfyui"])
        assert r[f"{dtype}/q_err_ours"] <= min(q_tol, r[f"{dtype}/q_err_comfyui"] * 1.0001), (seed, dtype)
        assert r[f"{dtype}/switch_equal"] is True, dtype
        assert "IDEOGRAM4_INT8_EXPERIMENTS has rope=comfyui" in r[f"{dtype}/switch_note"], dtype
        assert r[f"{dtype}/tables_of_a_batch"] is None, dtype


def test_a_q_k_rope_kernel_that_fails_is_demoted_once_and_the_attention_runs_its_twin(run_check):
    """A q/k norm + RoPE kernel that fails to build or launch inside ComfyUI's attention never fails the forward:
    the output is the twin's, the variant is tried once (q's call; k's and the next forward's go straight to the
    twin) and demoted with the error, and the model note, from that forward on, says the twin runs because of it."""
    r = run_check("rope_demotion")
    assert r["cpu_tries"] == 0 and r["cpu_note"].startswith(r["twin_note"] + ": ") and "CUDA" in r["cpu_note"]
    assert r["equal"] == [True, True]
    assert r["tries"] == 1, r["tries"]
    (demoted,) = r["demoted"]
    assert demoted["backend"] == "triton" and demoted["shape"][::2] == ["qk_norm_rope", "bfloat16"]
    assert "qk_norm_rope) failed (RuntimeError: out of resources: shared memory)" in demoted["reason"]
    assert r["note"] == r["later_note"] == f"{r['twin_note']}: {demoted['reason']}", r["note"]


def test_block_norms_run_the_pack_ops_in_native_models(run_check):
    """Every block's four modulated RMSNorms go through kernels.rms_norm_modulate / rms_norm_gated_residual
    (nodes/block_norms.py), twice each per block; on the CPU they run their twins, so the model's output equals
    ComfyUI's own block forward bit for bit; the note says which ran and why; the env switch runs ComfyUI's."""
    r = run_check("block_norms")
    for dtype in ("fp32", "bf16"):
        assert r[f"{dtype}/swapped"] == [True] * 4, dtype
        assert r[f"{dtype}/calls"] == [2 * 4, 2 * 4], dtype
        assert r[f"{dtype}/equal"] is True and r[f"{dtype}/switch_equal"] is True, dtype
        assert r[f"{dtype}/note"].startswith(r["twin_note"] + ": ") and "CUDA" in r[f"{dtype}/note"], dtype
        assert "IDEOGRAM4_INT8_EXPERIMENTS has block-norms=comfyui" in r[f"{dtype}/switch_note"], dtype
    assert "pack's fused kernel" in r["fused_note"]


def test_the_pre_norms_hand_off_only_to_linears_that_quantize_plain_rows(run_check):
    """The blocks ask their pre-norms for the quantization handoff (kernels/handoff.py) for qkv and w1 where those
    quantize plain rows (W8A8 with folded smoothing, bf16 quantized on load), never for int8_convrot (its quantizer
    rotates) or with the experiment block-norms=no-handoff; no offer is left after a forward."""
    r = run_check("block_norm_handoff")
    seed = r["__seed__"]
    for fmt, plain in (("w8a8", True), ("bf16", True), ("int8_convrot", False)):
        assert r[f"{fmt}/plain_rows"] == [[plain, plain]] * 4, (seed, fmt)
        assert r[f"{fmt}/default/asked"] == [plain] * 8, (seed, fmt)
        assert r[f"{fmt}/no-handoff/asked"] == [False] * 8, (seed, fmt)
        assert r[f"{fmt}/default/pending"] is False and r[f"{fmt}/no-handoff/pending"] is False, (seed, fmt)
    assert "quantizing the qkv and gate/up inputs" in r["handoff_note"]
    # a foreign pre-hook on qkv (block 0) and an instance forward on the FFN (block 1) stop it; the pack's streaming
    # bind on qkv (block 1) does not
    assert r["w8a8/hooked/reaches"] == [False, True, True, False], seed


def test_the_context_is_cast_to_the_sampling_device_once_per_run(run_check):
    """ComfyUI's model base casts the context to the GPU in every model call; the pack's models return it from
    extra_conds (once per run) already on the sampling device in the inference dtype, where that cast is a no-op.
    On the CPU nothing moves."""
    r = run_check("resident_conds")
    assert r["wrapped"] is True and r["wrapped_once"] is True
    assert r["cpu_same_tensor"] is True
    assert r["meta"] == ["meta", "torch.bfloat16", "torch.bfloat16", True], r["meta"]
    assert r["meta_cast_is_noop"] is True
    assert r["switched_off_same_tensor"] is True


def test_step_profile_cuts_at_the_samplers_steps(run_check):
    """bench/step_profile.py through the pack's sampler: one callback per step, in order; the profiled middle steps
    run the same operators per step in a 5- and an 8-step run; the noise drawn once per run stays out of them."""
    r = run_check("step_profile")
    for steps, profiled in ((5, [2, 3]), (8, [3, 4])):
        assert r[f"{steps}/seen"] == list(range(steps))
        assert r[f"{steps}/profile"] == {"steps": profiled, "run_steps": steps}
        assert "aten::normal_" not in r[f"{steps}/per_step_counts"]  # (randn's own time may read 0)
        assert r[f"{steps}/per_run"]["aten::normal_"]["count"] == 1
    assert r["5/per_step_counts"] == r["8/per_step_counts"]
    assert r["5/per_step_counts"]["aten::_int_mm"] > 0  # the branches' int8 GEMMs are per-step rows


def test_lora_merged_in_full_load_keeps_w1_w3_int8_and_fused(run_check):
    """A LoRA on w1 / w3 merged in full-load mode is requantized: the weights stay int8, the pair stays one fused
    call, equal to the merged modules' own forwards and close to the float reference of W + delta; in lowvram the
    patched block splits (labelled: the LoRA runs on the fly as a float GEMM) while the others stay fused."""
    r = run_check("gate_up_lora")
    seed = r["__seed__"]
    assert r["int8_after_merge"] is True
    assert r["merged_vs_w_plus_delta"] <= 0.05 < r["w_vs_w_plus_delta"], seed
    assert r["merged_fused"] == [[1, 0], [1, 0]]
    assert r["full_load_fusion"].startswith("gate/up pair: one")
    assert r["fused_vs_split_after_merge"] == 0.0, seed
    assert r["full_load_vs_ref"] <= 0.25 * r["effect"], seed
    assert r["after_unpatch_vs_before"] == 0.0 and r["after_lowvram_vs_before"] == 0.0
    assert r["lowvram_calls"] == [[0, 1], [1, 0]]
    # lowvram adds delta to the dequantized int8 weight in float; the reference quantizes W + delta: the two differ by
    # the patched layers' quantization noise: 0-1.8% of the LoRA's effect over 8 seeds, with and without the smoothing
    # fold (the earlier 1% bound failed about one seed in eight either way)
    assert r["lowvram_vs_ref"] <= 0.03 * r["effect"], seed
    assert r["lowvram_w1_path"] == "bf16" and "w1|w3 not fused: a weight patch (LoRA)" in r["lowvram_w1_reason"]
    assert r["lowvram_w1_fusion"].startswith("not fused with w3") and r["lowvram_block1_fusion"].startswith("gate/up")


def test_a_compiled_forward_replayed_in_part_is_not_called_a_bypass(run_check):
    """While CUDA-graph trees live, an unmoved layer that a compiled graph ran through the op before is replayed, one
    that no compiled graph ever ran is bypassed; without graph trees every unmoved layer is a bypass."""
    r = run_check("coverage_replay")
    q = r["quantized"]
    assert q == 23 and r["sites"]
    assert r["ran_all"] == {"expected": q, "ran": q, "missing": [], "replayed": [], "note": None}
    replayed = r["replayed_all"]
    assert replayed["missing"] == [] and len(replayed["replayed"]) == q and replayed["ran"] == 0
    assert replayed["note"] is None and r["replayed_forwards"] == 1
    part = r["part_replayed"]
    assert part["missing"] == [r["never_ran"]] and len(part["replayed"]) == q - 4 and part["ran"] == 3
    assert part["note"].startswith(f"1 of {q} quantized linears did not run through the pack's op ({r['never_ran']})")
    strict = r["strict"]
    assert len(strict["missing"]) == 1 and strict["replayed"] == [] and strict["ran"] == q - 1
    assert strict["note"].startswith(f"1 of {q} quantized linears did not run")


def test_every_quantized_linear_runs_through_the_op_and_a_bypass_is_labelled(run_check):
    """Per forward, registry calls of the quantized linears = their number (llm_cond_proj only with a text context),
    through the sampler too; a forward that computes layers without the pack's op (F.linear on a dequantized weight,
    an FFN of its own) labels the model: registry note, report (model and status notes), layer reasons, one log."""
    r = run_check("coverage")
    q = r["quantized"]
    assert q == 23 and r["all_linears"] == 31
    assert r["conditional/registry_calls"] == q
    assert r["conditional/coverage"] == {"expected": q, "ran": q, "missing": [], "replayed": []}
    assert r["image_only/registry_calls"] == q - 1 and r["image_only/coverage"]["ran"] == q - 1
    assert r["sampler_forwards"] == 2 and r["sampler_uncond_forwards"] == 2
    # before the bypass, each model carries only its q/k RoPE and block-norm notes (nodes/qk_rope.py, block_norms.py)
    assert {label: sorted(n) for label, n in r["notes_before"].items()} == {
        "conditional": ["block_norms", "rope"],
        "unconditional": ["block_norms", "rope"],
    }
    missing = ["layers.1.feed_forward.w1", "layers.1.feed_forward.w3", "layers.2.attention.o"]
    assert r["bypass/coverage"] == {"expected": q, "ran": q - 3, "missing": missing, "replayed": []}
    assert r["bypass/counts"] == [2, 6]
    note = r["bypass/note"]
    assert note.startswith(f"3 of {q} quantized linears did not run through the pack's op") and all(
        m in note for m in missing
    )
    assert note.endswith("seen in 2 of 6 forwards")
    assert len(r["bypass/logged"]) == 1  # logged once per model
    assert "not run through the pack's op" in r["bypass/o_reason"]
    assert "not run through" not in r["bypass/qkv_reason"]
    assert r["report_bypass"] == {"conditional": note, "unconditional": None}
    assert f"conditional: {note}" in r["report_notes"]
    assert r["report_valid"] in (True, None)


def test_native_model_compiles_in_one_graph_without_recompiles(run_check):
    """torch.compile (issue 23) on ComfyUI's native Ideogram 4 with the pack's ops, loaded by the pack's loader from
    the transformerlab W8A8 layout (smoothing folded at load: w1|w3 fused; w1/w3 mode 'ratio': split, labelled) and
    the int8_convrot layout, each branch with ComfyUI's forward args (text context, with a mask, image only) and the
    pack's attention override: dynamo gives no graph break; fullgraph aot_eager equals eager bit for bit (the same
    kernels run: the pack's ops are opaque to dynamo) over 3 sampling steps (new noise and sigma) compiled once; the
    registry records every layer each step with eager's path, reason and fusion; op_coverage checks each compiled
    forward and catches a layer computed around the op inside the graph. ComfyUI's own torch.compile wrapper (its
    TorchCompileModel's, with its guard filter) through apply_model and through comfy.sample: eager's output, no
    recompile on the next steps or the next run."""
    r = run_check("compile")
    seed = r["__seed__"]
    # w8a8_fp8_protected: the loader's protected_layers = fp8 (its 2 protected w2 run the fp8 op: the float fallback
    # on this CPU, the same opaque op in the graph)
    quantized = {"w8a8": 23, "w8a8_ratio": 23, "int8_convrot": 25, "w8a8_fp8_protected": 25}
    for fmt, q in quantized.items():
        assert r[f"{fmt}/conditional/quantized"] == q and r[f"{fmt}/unconditional/quantized"] == q - 1
        fp8 = 2 if fmt == "w8a8_fp8_protected" else 0
        assert r[f"{fmt}/conditional/fp8"] == fp8 and r[f"{fmt}/unconditional/fp8"] == fp8
        assert r[f"{fmt}/conditional/override"] == ["optimized_attention_override"]
        for case in ("conditional", "conditional_masked", "image_only"):
            key = f"{fmt}/{case}"
            expected = q - 1 if case == "image_only" else q
            assert r[f"{key}/break_reasons"] == [] and r[f"{key}/graph_break_counter"] == 0, (seed, key)
            # the forward in one graph; op_coverage's hook runs as its own frame: a graph of its one op
            assert r[f"{key}/graphs"] == 2 and isinstance(r[f"{key}/graph_ops"][0], int), (seed, key)
            assert r[f"{key}/graph_ops"][1] == ["ideogram4_int8.after_forward.default"], (seed, key)
            assert r[f"{key}/frames"] == 2, (seed, key)  # fullgraph: forward + hook, compiled once for 3 steps
            assert r[f"{key}/max_abs"] == 0.0 and r[f"{key}/eager_norm"] > 1.0, (seed, key)
            assert r[f"{key}/records_equal"] and r[f"{key}/calls_per_layer"] == [3], (seed, key)
            assert r[f"{key}/coverage_forwards"] == 3 and r[f"{key}/coverage_bypassed"] == 0, (seed, key)
            want = {"expected": expected, "ran": expected, "missing": [], "replayed": []}
            assert r[f"{key}/coverage_last"] == want, (seed, key)
            ops = {
                f"ideogram4_int8.{n}.default" for n in ("w8a8_linear", "float_linear", "after_forward", "qk_norm_rope")
            }
            pair = "ideogram4_int8.swiglu_w8a8_pair.default"
            if fmt == "w8a8_fp8_protected":
                ops |= {"ideogram4_int8.fp8_linear.default"}
            assert set(r[f"{key}/ops_in_graph"]) == (ops if fmt == "w8a8_ratio" else ops | {pair}), (seed, key)
    # each block compiled on its own (KJNodes' "transformer blocks only"): one frame per kind of block, not per block
    # (the W8A8 file's odd blocks keep w2 in bf16: two kinds), every layer recorded under its own site as in eager
    for fmt, kinds in (("w8a8", 2), ("w8a8_ratio", 2), ("int8_convrot", 1), ("w8a8_fp8_protected", 2)):
        for branch in ("conditional", "unconditional"):
            key = f"{fmt}/{branch}/per_block"
            assert r[f"{key}/blocks"] == 4 and r[f"{key}/frames"] == kinds, (seed, key)
            assert r[f"{key}/max_abs"] == 0.0 and r[f"{key}/records_equal"], (seed, key)
            assert r[f"{key}/calls_per_layer"] == [2], (seed, key)
    # a linear computed around the pack's op inside the compiled graph: no break, and labelled after that forward
    assert r["bypass/break_reasons"] == []
    assert r["bypass/compiled_forwards"] == [2, 2]  # both compiled forwards checked, both labelled
    assert r["bypass/coverage_last"] == {"expected": 23, "ran": 22, "missing": ["layers.2.attention.o"], "replayed": []}
    assert "layers.2.attention.o" in r["bypass/note"]
    # ComfyUI's wrapper: one frame per model kind (+ its hook), each step equal to eager, both branches checked
    assert r["wrapper/frames"] == 4 and r["wrapper/max_abs"] == 0.0 and r["wrapper/eager_norm"] > 1.0, seed
    assert r["wrapper/coverage_forwards"] == [6, 6]  # 3 eager + 3 compiled steps per model
    assert r["wrapper/conditional/coverage_last"] == {"expected": 23, "ran": 23, "missing": [], "replayed": []}
    assert r["wrapper/image_only/coverage_last"] == {"expected": 22, "ran": 22, "missing": [], "replayed": []}
    # the pack's sampler node with TorchCompileModel's wrapper on the positive MODEL, or on both: eager's latent;
    # the negative pass given the positive MODEL's options (ComfyUI's dual-model guider) ran the positive weights
    assert r["sampler_node/eager_norm"] > 1.0
    assert r["sampler_node/positive_compiled"] == 0.0 and r["sampler_node/both_compiled"] == 0.0, seed
    assert r["sampler_node/positive_compiled_run_options"] > 0.01 * r["sampler_node/eager_norm"], seed
    assert "ideogram4_int8.swiglu_w8a8_pair.default" in r["wrapper/ops_in_graph"]
    assert r["sample/frames"] == 2, seed
    for diff, norm in r["sample/max_abs_and_norm"]:
        assert diff == 0.0 and norm > 1.0, seed


# -- a real server ---------------------------------------------------------------------------------------------


def _cfg():
    from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config

    return Ideogram4Config.demo()


SEED = int.from_bytes(os.urandom(3), "little")


def _setup_files(base: pathlib.Path) -> None:
    from comfyui_ideogram4_int8.ideogram4 import synthetic
    from safetensors.torch import save_file
    from workflow_models import two_branch_weights

    models = base / "models" / "diffusion_models"
    models.mkdir(parents=True)
    cfg = _cfg()
    synthetic.write_w8a8(models / "i4_w8a8.safetensors", two_branch_weights(cfg, SEED), cfg)
    save_file({"encoder.conv_in.weight": torch.randn(8, 3, 3, 3)}, str(models / "flux2_vae_like.safetensors"))
    g = torch.Generator().manual_seed(SEED)
    save_file({"cond": torch.randn(1, 6, cfg.llm_features_dim, generator=g)}, str(base / "cond.safetensors"))
    save_file({"cond": torch.randn(1, 77, 768, generator=g)}, str(base / "cond_clip_l.safetensors"))


@pytest.fixture(scope="module")
def srv():
    from comfyui_server import WITH_TEST_PACK, ComfyUIServer, started

    with started(ComfyUIServer(packs=WITH_TEST_PACK, setup=_setup_files)) as server:
        yield server


def _inputs(info):
    return {**info["input"].get("required", {}), **info["input"].get("optional", {})}


def test_object_info_lists_every_node_with_tooltips(srv):
    everything = srv.object_info()
    for node_id in NODE_IDS:
        info = everything[node_id]
        assert info["display_name"].startswith("Ideogram 4"), node_id
        assert info["category"].startswith("Ideogram 4 INT8/"), node_id
        for name, spec in _inputs(info).items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    assert everything["Ideogram4Int8Loader"]["output"] == ["MODEL", "MODEL", "STRING"]
    assert everything["Ideogram4Int8Patch"]["output"] == ["MODEL", "STRING"]
    assert everything["Ideogram4Int8Sampler"]["output"] == ["LATENT"]
    weights = _inputs(everything["Ideogram4Int8Loader"])["weights"]
    options = weights[1]["options"] if isinstance(weights[0], str) else weights[0]
    assert "i4_w8a8.safetensors" in options
    sampler = _inputs(everything["Ideogram4Int8Sampler"])
    assert sampler["width"][1]["default"] == 1024 and sampler["height"][1]["default"] == 1024
    width = sampler["width"][1]
    assert (width["step"], width["min"], width["max"]) == (16, 256, 2048)


def _cond(srv, name="cond.safetensors"):
    return {"class_type": "Ideogram4TestConditioning", "inputs": {"path": str(srv.base / name)}}


CUSTOM = {"steps": 4, "guidance": 7.0, "polish_steps": 1, "polish_guidance": 3.0, "mu": 0.0, "std": 1.75}


def _our_sampler(seed, **kw):
    inputs = {
        "model": ["1", 0],
        "model_negative": ["1", 1],
        "positive": ["2", 0],
        "seed": seed,
        "preset": "Turbo 12",
        "width": 256,
        "height": 256,
        "batch_size": 1,
        **CUSTOM,
    }
    inputs.update(kw)
    return {"class_type": "Ideogram4Int8Sampler", "inputs": inputs}


def _saved_latent(srv, entry, node="9"):
    from safetensors.torch import load_file

    info = entry["outputs"][node]["latents"][0]
    return load_file(str(srv.base / "output" / info["subfolder"] / info["filename"]))["latent_tensor"]


def _ok(entry):
    tracebacks = [
        "".join(d.get("traceback", [])) for kind, d in entry["status"]["messages"] if kind == "execution_error"
    ]
    assert entry["status"]["status_str"] == "success", "\n".join(tracebacks)


def test_loader_builds_both_models_through_prompt(srv):
    entry = srv.run_prompt({"1": loader_node(), "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}}})
    _ok(entry)
    summary = entry["outputs"]["2"]["text"][0]
    assert summary.startswith("conditional: i4_w8a8.safetensors")
    assert "unconditional: i4_w8a8.safetensors" in summary
    assert summary.count("GEMM paths: cublas-int8 23, bf16 8") == 2
    assert "bf16-protected layers (2)" in summary


def _reference_latent(srv, seed, preset, width=256, height=256, **custom):
    """ideogram4.sample with the reference DiT on the server's file; custom inputs default to CUSTOM (as the node's)."""
    custom = {**CUSTOM, **custom} if preset == "custom" else {}
    from comfyui_ideogram4_int8.ideogram4 import Ideogram4DiT, make_noise, read_branch, sample, sampling_args
    from comfyui_ideogram4_int8.ideogram4.w8a8_module import w8a8_linears
    from safetensors.torch import load_file

    path = srv.base / "models" / "diffusion_models" / "i4_w8a8.safetensors"
    models = [
        Ideogram4DiT.from_state_dict(read_branch(path, b, dtype=torch.float32), w8a8_linears(), dtype=torch.float32)
        for b in ("conditional", "unconditional")
    ]
    ctx = load_file(str(srv.base / "cond.safetensors"))["cond"]
    plan = sampling_args.plan_sampling(preset, width, height, **custom)
    with torch.no_grad():
        return sample(
            models[0],
            models[1],
            ctx,
            width=width,
            height=height,
            sigmas=plan.sigmas,
            guidance=plan.guidance,
            noise=make_noise(seed, width, height, 1),
        )


def test_native_dual_model_guider_graph_runs_with_our_models(srv):
    seed = SEED % 10000
    graph = {
        "1": loader_node(),
        "2": _cond(srv),
        "3": {
            "class_type": "DualModelGuider",  # negative left unconnected: the image-only unconditional pass
            "inputs": {"model": ["1", 0], "model_negative": ["1", 1], "positive": ["2", 0], "cfg": 7.0},
        },
        "4": {
            "class_type": "Ideogram4Scheduler",
            "inputs": {"steps": 4, "width": 256, "height": 256, "mu": 0.0, "std": 1.75},
        },
        "5": {"class_type": "RandomNoise", "inputs": {"noise_seed": seed}},
        "6": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "7": {"class_type": "EmptyFlux2LatentImage", "inputs": {"width": 256, "height": 256, "batch_size": 1}},
        "8": {
            "class_type": "SamplerCustomAdvanced",
            "inputs": {
                "noise": ["5", 0],
                "guider": ["3", 0],
                "sampler": ["6", 0],
                "sigmas": ["4", 0],
                "latent_image": ["7", 0],
            },
        },
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "native"}},
        "10": _our_sampler(seed, preset="custom", polish_steps=0),
        "11": {"class_type": "SaveLatent", "inputs": {"samples": ["10", 0], "filename_prefix": "ours"}},
    }
    entry = srv.run_prompt(graph, timeout=300)
    _ok(entry)
    native, ours = _saved_latent(srv, entry, "9"), _saved_latent(srv, entry, "11")
    assert native.shape == (1, 128, 16, 16)
    assert (native - ours).abs().max().item() == 0.0  # same guider, sampler, sigmas and noise inside ComfyUI
    ref = _reference_latent(srv, seed, "custom", polish_steps=0)
    rel = ((native.double() - ref.double()).norm() / ref.double().norm()).item()
    assert rel <= INT8_WHOLE_MODEL, rel  # other torch build in this process: activation-rounding flips only


def test_sampler_node_latent_matches_the_reference_sampler(srv):
    seed = (SEED + 17) % 100000
    graph = {
        "1": loader_node(),
        "2": _cond(srv),
        "8": _our_sampler(seed),
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "turbo"}},
    }
    entry = srv.run_prompt(graph, timeout=300)
    _ok(entry)
    got = _saved_latent(srv, entry)
    ref = _reference_latent(srv, seed, "Turbo 12")
    rel = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
    assert rel <= INT8_WHOLE_MODEL, rel
    other = _reference_latent(srv, seed + 1, "Turbo 12")
    assert ((got - other).norm() / other.norm()).item() > 0.1


def _interrupt(srv):
    req = urllib.request.Request(
        srv.url + "/interrupt", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_interrupt_mid_run_then_the_models_still_work(srv):
    seed = (SEED + 29) % 100000
    short = {
        "1": loader_node(),
        "2": _cond(srv),
        "8": _our_sampler(seed, preset="custom", steps=3),
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "short"}},
    }
    first = srv.run_prompt(short, timeout=300)
    _ok(first)
    long = {
        "1": loader_node(),
        "2": _cond(srv),
        "8": _our_sampler(seed + 1, preset="custom", steps=200, width=1024, height=1024),
        "9": {"class_type": "SaveLatent", "inputs": {"samples": ["8", 0], "filename_prefix": "long"}},
    }
    prompt_id = srv.queue_prompt(long)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the sampler is running
        running = srv.get_json("/queue")["queue_running"]
        if running and running[0][1] == prompt_id:
            break
        time.sleep(0.1)
    time.sleep(3.0)
    _interrupt(srv)
    entry = srv.wait_for_history(prompt_id, timeout=120)
    kinds = [m[0] for m in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds, entry["status"]
    # the loader's MODELs (cached by ComfyUI) run again: a new seed, so the sampler is not answered from the cache
    again = srv.run_prompt(dict(short, **{"8": _our_sampler(seed + 2, preset="custom", steps=3)}), timeout=300)
    _ok(again)
    got = _saved_latent(srv, again)
    ref = _reference_latent(srv, seed + 2, "custom", steps=3)
    assert ((got.double() - ref.double()).norm() / ref.double().norm()).item() <= INT8_WHOLE_MODEL
    assert not torch.equal(got, _saved_latent(srv, first))


def _error_text(srv, graph):
    from comfyui_server import ComfyUIError, history_errors

    try:
        entry = srv.run_prompt(graph, timeout=300)
    except ComfyUIError as exc:  # rejected by validation (HTTP 400 with node_errors)
        return str(exc)
    assert entry["status"]["status_str"] == "error", "expected the run to fail"
    return "\n".join(history_errors(entry))


def test_bad_inputs_fail_with_clear_errors_and_the_server_stays_up(srv):
    wrong_file = dict(loader_node(), inputs=dict(loader_node()["inputs"], weights="flux2_vae_like.safetensors"))
    text = _error_text(srv, {"1": wrong_file, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}}})
    assert "holds no Ideogram 4 DiT linears" in text and "flux2_vae_like.safetensors" in text
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv, "cond_clip_l.safetensors"),
            "8": _our_sampler(1),
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "[1, 77, 768]" in text and "CLIPLoader of type ideogram4" in text
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv),
            "8": _our_sampler(1, width=1000),
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "multiple of 16" in text
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv),
            "8": _our_sampler(1, width=2048, height=256),
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "6:1" in text
    text = _error_text(
        srv,
        {
            "3": {"class_type": "Ideogram4TestOtherModel", "inputs": {}},
            "4": {
                "class_type": "Ideogram4Int8Patch",
                "inputs": {"model": ["3", 0], "label": "conditional", "gemm_path": "auto"},
            },
            "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 1]}},
        },
    )
    assert "not an Ideogram 4 diffusion model" in text
    bad_negative = _our_sampler(1)
    bad_negative["inputs"]["model_negative"] = ["3", 0]
    text = _error_text(
        srv,
        {
            "1": loader_node(),
            "2": _cond(srv),
            "3": {"class_type": "Ideogram4TestOtherModel", "inputs": {}},
            "8": bad_negative,
            "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 0]}},
        },
    )
    assert "'model_negative'" in text and "not an Ideogram 4 diffusion model" in text
    assert srv.proc.poll() is None
    assert srv.get_json("/system_stats")["system"]
    _ok(srv.run_prompt({"1": loader_node(), "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 2]}}}))


def test_example_workflow_validates_up_to_the_missing_model_files(srv):
    from comfyui_server import ComfyUIError

    graph = json.loads((ROOT / "example_workflows" / "api" / "ideogram4_int8_text_to_image_api.json").read_text())
    # the caption builder is an output node that validates, so ComfyUI accepts the prompt for that part and reports
    # the rest in node_errors (a prompt with no valid output at all is refused with HTTP 400 and the same errors)
    try:
        body = srv.post_json("/prompt", {"prompt": graph, "client_id": "validate"})
        srv.wait_for_history(body["prompt_id"])
    except ComfyUIError as err:
        body = json.loads(str(err).split(": ", 1)[1])
    errors = body["node_errors"]
    assert "return_type_mismatch" not in json.dumps(errors)
    problems = {
        (graph[k]["class_type"], e["extra_info"]["input_name"])
        for k, v in errors.items()
        for e in v["errors"]
        if e["type"] == "value_not_in_list"
    }
    assert problems == {("Ideogram4Int8Loader", "weights"), ("CLIPLoader", "clip_name"), ("VAELoader", "vae_name")}, (
        errors
    )
