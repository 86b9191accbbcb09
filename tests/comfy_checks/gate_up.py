"""The fused gate/up (w1 / w3) projection, alone and under a LoRA."""

import os

import comfy.model_management
import torch
from comfy_stock import stock_dit
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4 import read_branch, synthetic
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
from comfyui_ideogram4_int8.ideogram4.w8a8_module import dequantize_entries, w8a8_linears
from comfyui_ideogram4_int8.nodes import loader_nodes
from comfyui_ideogram4_int8.nodes.runtime import int8_ops

from comfy_checks.common import CFG, MODELS, G, experiments, inputs, load, reference, rel, seed, weights, write_all


def write_shared_smooth(name="i4_w8a8_shared.safetensors"):
    """The transformerlab layout with one SmoothQuant vector shared by each block's w1 and w3 (what folding the
    vectors at load offers): every quantized layer smoothed, w1 / w3 dividing by the same vector."""
    w = {"conditional": weights(seed), "unconditional": weights(seed + 1)}
    vectors = {}
    for b in w:
        v = synthetic.smooth_vectors(w[b], CFG)
        for i in range(CFG.num_layers):
            v[f"layers.{i}.feed_forward.w3"] = v[f"layers.{i}.feed_forward.w1"].clone()
        vectors[b] = v
    return str(synthetic.write_w8a8(os.path.join(MODELS, name), w, CFG, smooth=vectors))


def _stock_keys():
    return set(stock_dit(CFG, device="meta").state_dict())


QUANT_EXTRAS = (".weight_scale", ".comfy_quant", ".input_smooth", ".input_folded")  # the pack's extra tensors


def _quant_calls():
    return kernels.REGISTRY.launches["quant_twin"] + kernels.REGISTRY.launches["quant_triton"]


def check_gate_up():
    """Each block's w1|w3 as one fused call (one quantization) in ComfyUI's native model: the module tree and the
    state-dict keys stay native; the fused forward equals the two modules' own forwards exactly (fp32); it serves for
    no smoothing / a shared vector / ConvRot, splits (labelled) for different vectors, hooks, on-the-fly patches,
    offloaded or streamed weights; a partial (lowvram) load keeps it and the same output."""
    from comfyui_ideogram4_int8.nodes.runtime import ffn_fusion, op_coverage

    write_all()
    write_shared_smooth()
    x, ctx, sigma, mask = inputs()
    stock = _stock_keys()
    res = {}
    for fmt, cf, uf in (
        ("w8a8_shared", "i4_w8a8_shared.safetensors", loader_nodes.SAME_FILE),
        ("int8_convrot", "i4_int8_convrot.safetensors", "i4_unconditional_int8_convrot.safetensors"),
        ("fp8", "i4_fp8_scaled.safetensors", "i4_unconditional_fp8_scaled.safetensors"),
        ("w8a8", "i4_w8a8.safetensors", loader_nodes.SAME_FILE),
        ("w8a8_min", "i4_w8a8.safetensors", loader_nodes.SAME_FILE),
    ):
        # the transformerlab layout (w1 and w3 with different vectors): folded with w1/w3 mode 'ratio' w3 still
        # divides by a ratio at run time (two quantizer passes, split); with the default 'min' both share a vector
        with experiments("smooth-fold=ratio" if fmt == "w8a8" else ""):
            cond, uncond, summary = load(cf, uf)
        dm = cond.model.diffusion_model
        ffs = [b.feed_forward for b in dm.layers]
        res[f"{fmt}/summary"] = [ln.strip() for ln in summary.splitlines() if "FFN w1|w3" in ln]
        res[f"{fmt}/gate_up_modules"] = sum(type(f) is ffn_fusion.GateUpFeedForward for f in ffs)
        res[f"{fmt}/children"] = sorted(dict(ffs[0].named_children()))
        ours = {k for k in dm.state_dict() if not k.endswith(QUANT_EXTRAS)}
        res[f"{fmt}/native_keys"] = ours == stock
        q0 = _quant_calls()
        with torch.no_grad():
            fused = dm(x, sigma, context=ctx)
        cov = op_coverage.coverage(dm).last
        res[f"{fmt}/quantizer_passes"] = _quant_calls() - q0
        res[f"{fmt}/coverage"] = cov
        res[f"{fmt}/fused_calls"] = [f.fused_calls for f in ffs]
        res[f"{fmt}/split_calls"] = [f.split_calls for f in ffs]
        res[f"{fmt}/last_split"] = ffs[0].last_split
        rec = {r.layer: r for r in kernels.REGISTRY.layers("conditional")}
        res[f"{fmt}/w1_fusion"] = rec["layers.0.feed_forward.w1"].fusion
        res[f"{fmt}/w3_reason"] = rec["layers.0.feed_forward.w3"].reason
        with experiments(ffn_fusion.EXPERIMENT), torch.no_grad():
            split = dm(x, sigma, context=ctx)
        res[f"{fmt}/fused_vs_split_max_abs"] = (fused - split).abs().max().item()
        res[f"{fmt}/vs_reference_dit"] = rel(fused, _ref_forward(cf, x, sigma, ctx))
        with torch.no_grad():
            uncond.model.diffusion_model(x, sigma)  # image-only: llm_cond_proj does not run
        res[f"{fmt}/uncond_coverage"] = op_coverage.coverage(uncond.model.diffusion_model).last
    # bf16 compute: the pair rounds once (float32 SwiGLU), the split path rounds g and u first: close, not equal
    cond, _, _ = load("i4_fp8_scaled.safetensors", "i4_unconditional_fp8_scaled.safetensors", dtype="bf16")
    dm = cond.model.diffusion_model
    xb, cb = x.bfloat16(), ctx.bfloat16()  # as ComfyUI's apply_model casts them to the inference dtype
    with torch.no_grad():
        fused = dm(xb, sigma, context=cb)
        with experiments(ffn_fusion.EXPERIMENT):
            split = dm(xb, sigma, context=cb)
    res["bf16/dtype"] = str(fused.dtype)
    res["bf16/fused_calls"] = [b.feed_forward.fused_calls for b in dm.layers]
    res["bf16/fused_vs_split"] = rel(fused.float(), split.float())
    # split reasons, each with the pair's other conditions met; loaded unfolded, so both linears divide their input
    # by the file's (shared) vector at run time and an in-place change of one vector must be seen
    with experiments("smooth-fold=off"):
        cond, _, _ = load("i4_w8a8_shared.safetensors")
    dm = cond.model.diffusion_model
    ff = dm.layers[0].feed_forward
    xin = torch.randn(1, 3, CFG.emb_dim)
    reasons = {"ok": ffn_fusion.split_reason(ff, xin)}
    reasons["offloaded"] = ffn_fusion.split_reason(ff, xin.to("meta"))
    ff.w3._v = object()
    reasons["streamed"] = ffn_fusion.split_reason(ff, xin)
    del ff.w3._v
    handle = ff.w1.register_forward_hook(lambda *a: None)
    reasons["hooked"] = ffn_fusion.split_reason(ff, xin)
    handle.remove()
    ff.w1.weight_function = [lambda w: w]
    reasons["patched"] = ffn_fusion.split_reason(ff, xin)
    del ff.w1.weight_function
    ff.w3._full_precision_mm = True
    reasons["full_precision"] = ffn_fusion.split_reason(ff, xin)
    ff.w3._full_precision_mm = False
    with torch.no_grad():
        ff.w3.input_smooth.mul_(1.5)  # a new version of the vector: compared again
    reasons["smooth_changed"] = ffn_fusion.split_reason(ff, xin)
    with torch.no_grad():
        ff.w3.input_smooth.div_(1.5)
        ff.w3.input_smooth.copy_(ff.w1.input_smooth)
    reasons["smooth_restored"] = ffn_fusion.split_reason(ff, xin)
    res["reasons"] = reasons
    # partial load (lowvram: every module cast per call, weights on the offload device = the CPU here): still fused,
    # the same output
    with torch.no_grad():
        full = dm(x, sigma, context=ctx)
    cond.patch_model(device_to=torch.device("cpu"), lowvram_model_memory=1)
    try:
        res["lowvram_cast_w1"] = bool(ff.w1.comfy_cast_weights)
        n0 = ff.fused_calls
        with torch.no_grad():
            res["lowvram_max_abs"] = (dm(x, sigma, context=ctx) - full).abs().max().item()
        res["lowvram_fused"] = ff.fused_calls - n0
    finally:
        cond.unpatch_model()
    return res


def _ref_forward(fname, x, sigma, ctx, branch="conditional"):
    with torch.no_grad():
        return reference(os.path.join(MODELS, fname), branch)(x, sigma, context=ctx)


def check_gate_up_lora():
    """LoRA on w1 / w3 (smoothed, with the vector they share). Full load: merged into the real W and requantized
    (set_weight): w1 / w3 stay int8 and the pair stays ONE fused call, equal to the merged modules' own forwards and
    close to the float reference of W + delta. Lowvram: the patched block splits (labelled), the others stay fused.
    Unpatching restores the exact output."""
    from comfyui_ideogram4_int8.nodes.runtime import ffn_fusion

    write_all()
    path = write_shared_smooth()
    cond, _, _ = load("i4_w8a8_shared.safetensors")
    x, ctx, sigma, mask = inputs()
    names = ("layers.0.feed_forward.w1", "layers.0.feed_forward.w3", "layers.2.feed_forward.w3")
    st = read_branch(path, "conditional", dtype=torch.float32)
    patched_state = read_branch(path, "conditional", dtype=torch.float32)
    deltas, real = {}, {}
    for key in names:
        entries = {e: st[f"{key}.{e}"] for e in ("weight", "weight_scale", "input_smooth") if f"{key}.{e}" in st}
        real[key] = dequantize_entries(entries, torch.float32)
        deltas[key] = 0.5 * real[key].std() * torch.randn(real[key].shape, generator=G)
        for e in ("weight_scale", "input_smooth"):
            patched_state.pop(f"{key}.{e}", None)
        patched_state[f"{key}.weight"] = real[key] + deltas[key]
    ref = Ideogram4DiT.from_state_dict(patched_state, w8a8_linears(), config=CFG, dtype=torch.float32, label="ref")
    with torch.no_grad():
        want = ref(x, sigma, context=ctx)
        unpatched = reference(path, "conditional")(x, sigma, context=ctx)
        before = cond.model.diffusion_model(x, sigma, context=ctx)
    res = {"effect": rel(unpatched, want)}
    lora = cond.clone()
    lora.add_patches({f"diffusion_model.{k}.weight": (d,) for k, d in deltas.items()}, 1.0)
    comfy.model_management.load_models_gpu([lora])  # full load: merged through convert_weight / set_weight
    dm = lora.model.diffusion_model
    ffs = (dm.layers[0].feed_forward, dm.layers[2].feed_forward)
    res["int8_after_merge"] = all(
        int8_ops.is_int8_weight(f.w1.weight) and int8_ops.is_int8_weight(f.w3.weight) for f in ffs
    )
    merged = ffs[0].w1.convert_weight(ffs[0].w1.weight).float()
    res["merged_vs_w_plus_delta"] = rel(merged, real[names[0]] + deltas[names[0]])
    res["w_vs_w_plus_delta"] = rel(real[names[0]], real[names[0]] + deltas[names[0]])
    n0 = [(f.fused_calls, f.split_calls) for f in ffs]
    with torch.no_grad():
        got = dm(x, sigma, context=ctx)
    res["merged_fused"] = [(f.fused_calls - a, f.split_calls - b) for f, (a, b) in zip(ffs, n0, strict=True)]
    res["full_load_vs_ref"] = rel(got, want)
    res["full_load_fusion"] = {r.layer: r.fusion for r in kernels.REGISTRY.layers("conditional")}[names[0]]
    with experiments(ffn_fusion.EXPERIMENT), torch.no_grad():
        res["fused_vs_split_after_merge"] = (got - dm(x, sigma, context=ctx)).abs().max().item()
    comfy.model_management.unload_all_models()
    with torch.no_grad():
        res["after_unpatch_vs_before"] = (cond.model.diffusion_model(x, sigma, context=ctx) - before).abs().max().item()
    # lowvram: the patches run on the fly on the dequantized weights (a float GEMM): that block splits, labelled
    lora.patch_model(device_to=torch.device("cpu"), lowvram_model_memory=1)
    try:
        n0 = [(f.fused_calls, f.split_calls) for f in (dm.layers[0].feed_forward, dm.layers[1].feed_forward)]
        with torch.no_grad():
            got_lv = dm(x, sigma, context=ctx)
        res["lowvram_calls"] = [
            (f.fused_calls - a, f.split_calls - b)
            for f, (a, b) in zip((dm.layers[0].feed_forward, dm.layers[1].feed_forward), n0, strict=True)
        ]
        res["lowvram_vs_ref"] = rel(got_lv, want)
        rec = {r.layer: r for r in kernels.REGISTRY.layers("conditional")}
        res["lowvram_w1_reason"] = rec[names[0]].reason
        res["lowvram_w1_fusion"] = rec[names[0]].fusion
        res["lowvram_w1_path"] = rec[names[0]].path
        res["lowvram_block1_fusion"] = rec["layers.1.feed_forward.w1"].fusion
    finally:
        lora.unpatch_model()
    with torch.no_grad():
        res["after_lowvram_vs_before"] = (cond.model.diffusion_model(x, sigma, context=ctx) - before).abs().max().item()
    return res
