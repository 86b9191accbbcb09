"""The pack's fused ops inside ComfyUI 0.33's native Ideogram 4 models (``comfy_nodes_script.py`` run by ComfyUI's own
Python, --cpu): the gate/up pair as one call, q/k norm + RoPE, the block norms and the pre-norm hand-off, the context
cast, the step profile, LoRA merged into fused layers, bypass labels and torch.compile in one graph."""

from __future__ import annotations

import pytest
from comfy_check_run import INT8_WHOLE_MODEL, check_runner

pytestmark = pytest.mark.comfyui


@pytest.fixture(scope="module")
def run_check(tmp_path_factory):
    return check_runner(tmp_path_factory)


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
    """Every block's attention runs q/k RMSNorm + RoPE through kernels.qk_norm_rope (nodes/runtime/qk_rope.py), equal to
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
    (nodes/runtime/block_norms.py), twice each per block; on the CPU they run their twins, so the model's output equals
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
    # before the bypass, each model carries only its q/k RoPE and block-norm notes
    # (nodes/runtime/qk_rope.py, block_norms.py)
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
