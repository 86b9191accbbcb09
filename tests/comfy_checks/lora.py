"""Weight patches (LoRAs) on a SmoothQuant layer, and on every kind of layer a smoothing fold touches."""

import os

import comfy.model_management
import comfy.utils
import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4 import read_branch, synthetic
from comfyui_ideogram4_int8.ideogram4.dit import Ideogram4DiT
from comfyui_ideogram4_int8.ideogram4.w8a8_module import dequantize_entries, w8a8_linears
from comfyui_ideogram4_int8.nodes.runtime import int8_ops

from comfy_checks.common import CFG, MODELS, G, experiments, inputs, load, reference, rel, seed, weights, write_all


def _qkv(model):
    return model.model.diffusion_model.layers[0].attention.qkv


def check_lora():
    """A weight patch on a SmoothQuant layer: full load (merged, requantized, stays int8) and lowvram (on the fly)."""
    write_all()
    cond, _, _ = load("i4_w8a8.safetensors")
    x, ctx, sigma, mask = inputs()
    key = "layers.0.attention.qkv"
    st = read_branch(os.path.join(MODELS, "i4_w8a8.safetensors"), "conditional", dtype=torch.float32)
    entries = {e: st[f"{key}.{e}"] for e in ("weight", "weight_scale", "input_smooth") if f"{key}.{e}" in st}
    w_real = dequantize_entries(entries, torch.float32)
    delta = 0.5 * w_real.std() * torch.randn(w_real.shape, generator=G)
    # reference: our DiT with that one layer as a float linear holding W + delta, the rest the same int8 operands
    patched_state = read_branch(os.path.join(MODELS, "i4_w8a8.safetensors"), "conditional", dtype=torch.float32)
    for e in ("weight_scale", "input_smooth"):
        patched_state.pop(f"{key}.{e}", None)
    patched_state[f"{key}.weight"] = w_real + delta
    ref = Ideogram4DiT.from_state_dict(patched_state, w8a8_linears(), config=CFG, dtype=torch.float32, label="ref")
    base_ref = reference(os.path.join(MODELS, "i4_w8a8.safetensors"), "conditional")
    with torch.no_grad():
        want = ref(x, sigma, context=ctx)
        unpatched = base_ref(x, sigma, context=ctx)
    res = {"smoothed": _qkv(cond).input_smooth is not None, "unpatched_vs_patched_ref": rel(unpatched, want)}
    with torch.no_grad():  # the native model itself before any patch: unpatching must restore exactly this
        before = cond.model.diffusion_model(x, sigma, context=ctx)
    lora = cond.clone()
    lora.add_patches({f"diffusion_model.{key}.weight": (delta,)}, 1.0)
    # full load: ModelPatcher merges the patch through convert_weight / set_weight
    comfy.model_management.load_models_gpu([lora])
    res["full_load_int8"] = int8_ops.is_int8_weight(_qkv(lora).weight)
    merged = _qkv(lora).convert_weight(_qkv(lora).weight).float()
    res["merged_weight_vs_w_plus_delta"] = rel(merged, w_real + delta)
    res["w_vs_w_plus_delta"] = rel(w_real, w_real + delta)
    with torch.no_grad():
        got = lora.model.diffusion_model(x, sigma, context=ctx)
    res["full_load_vs_ref"] = rel(got, want)
    res["full_load_path"] = {r.layer: r for r in kernels.REGISTRY.layers("conditional")}[key].path
    comfy.model_management.unload_all_models()
    with torch.no_grad():
        # same model before and after: exact (comparing against our reference DiT instead would mix in the
        # chaotic int8 rounding flips between two implementations, seen up to 1.5e-3 for some seeds)
        res["after_unpatch_vs_unpatched"] = rel(cond.model.diffusion_model(x, sigma, context=ctx), before)
    # lowvram: every module cast per call, the patch applied on the fly on the dequantized weight
    lora.patch_model(device_to=torch.device("cpu"), lowvram_model_memory=1)
    try:
        res["lowvram_cast_modules"] = sum(
            bool(getattr(m, "comfy_cast_weights", False))
            for m in int8_ops.int8_linears(lora.model.diffusion_model).values()
        )
        res["lowvram_weight_function"] = len(_qkv(lora).weight_function)
        with torch.no_grad():
            got_lv = lora.model.diffusion_model(x, sigma, context=ctx)
        res["lowvram_vs_ref"] = rel(got_lv, want)
        rec = {r.layer: r for r in kernels.REGISTRY.layers("conditional")}[key]
        res["lowvram_path"] = rec.path
        res["lowvram_reason"] = rec.reason
    finally:
        lora.unpatch_model()
    with torch.no_grad():
        res["after_lowvram_vs_unpatched"] = rel(cond.model.diffusion_model(x, sigma, context=ctx), before)
    return res


# the layers a LoRA patches in check_smooth: every kind of fold (own smoothing, v-row / w3-row folds, norm folds)
LORA_KEYS = (
    "layers.0.attention.qkv",
    "layers.0.attention.o",
    "layers.0.feed_forward.w1",
    "layers.0.feed_forward.w3",
    "layers.0.feed_forward.w2",
    "llm_cond_proj",
    "layers.0.adaln_modulation",
    "layers.0.attention_norm1",
    "layers.0.ffn_norm1",
)


def _load_mode(name, mode):
    """The loader's MODELs with the smoothing fold mode ``mode`` (None: the default)."""
    with experiments(f"smooth-fold={mode}" if mode is not None else ""):
        return load(name)


def _divides_per_forward(dm):
    return sum(getattr(m, "input_divisor", None) is not None for m in int8_ops.int8_linears(dm).values())


def _lora_patches(dm):
    """One weight patch per LORA_KEYS layer (a norm gets a small diff, a linear 0.3 std of its real weight)."""
    mods = dict(dm.named_modules())
    patches = {}
    for key in LORA_KEYS:
        m = mods[key]
        w = m.convert_weight(m.weight) if hasattr(m, "convert_weight") else m.weight
        w = w.float()
        delta = (0.1 if "norm" in key else 0.3 * w.std().item()) * torch.randn(w.shape, generator=G)
        patches[f"diffusion_model.{key}.weight"] = (delta,)
    return patches


def _real_weights(dm):
    mods = dict(dm.named_modules())
    return {key: mods[key].convert_weight(mods[key].weight).float().clone() for key in LORA_KEYS}


def _layerwise_vs_off(dm_k, dm_off, keys):
    """Each layer of ``keys`` in a folded model against the unfolded model's, on the input each expects: the
    unfolded layer gets x, the folded one x / f (its input_folded, or a norm's fold after it); a producer's
    folded output rows are multiplied back. Largest relative difference (exact up to float rounding)."""
    mk, mo = dict(dm_k.named_modules()), dict(dm_off.named_modules())
    worst = 0.0
    g = torch.Generator().manual_seed(seed + 11)
    for key in keys:
        a, b = mk[key], mo[key]
        k = b.weight.shape[-1]
        x = torch.randn(3, 5, k, generator=g)
        with torch.no_grad():
            if "norm" in key:
                fold = getattr(a, "ideogram4_fold", None)
                got = a(x) * (fold if fold is not None else 1.0)
                want = b(x)
            else:
                f = a.input_folded
                got = a(x / f if f is not None else x)
                if a.output_folded is not None:
                    got = got * a.output_folded
                want = b(x)
        worst = max(worst, rel(got, want))
    return worst


def check_smooth():
    """A transformerlab-layout file with a SmoothQuant vector on every quantized layer (w1 / w3 different) through
    the loader: folded (default 'min', and 'ratio') against unfolded ('off'): module state, the fold's producers
    linked for LoRA, divides per forward, summary and panel notes, outputs; a LoRA on every kind of folded layer
    (and on the norms that carry folds) merged in full-load mode and applied on the fly in lowvram mode gives the
    unfolded model's result."""
    w = {"conditional": weights(seed), "unconditional": weights(seed + 1)}
    protected = set(synthetic.default_protected(CFG))
    names = (set(CFG.default_quantized()) | {"adaln_proj", "t_embedding.mlp_out"}) - protected
    vectors = {b: synthetic.smooth_vectors(w[b], CFG, names=names, seed=seed) for b in w}
    synthetic.write_w8a8(os.path.join(MODELS, "i4_smooth.safetensors"), w, CFG, smooth=vectors, quantized=names)
    x, ctx, sigma, mask = inputs()
    res = {"smoothed_layers": len(names)}
    models, summaries = {}, {}
    for mode in ("off", "ratio", None):
        cond, _, summary = _load_mode("i4_smooth.safetensors", mode)
        models[mode or "min"], summaries[mode or "min"] = cond, summary
    res.update({f"summary_{k}": v for k, v in summaries.items()})
    dm = {k: m.model.diffusion_model for k, m in models.items()}
    mods = {k: dict(d.named_modules()) for k, d in dm.items()}
    qkv, o = mods["min"]["layers.0.attention.qkv"], mods["min"]["layers.0.attention.o"]
    res["qkv_folded"] = qkv.input_folded is not None and qkv.input_divisor is None
    res["off_divides_by_s"] = bool(
        torch.equal(
            mods["off"]["layers.0.attention.qkv"].input_divisor, mods["off"]["layers.0.attention.qkv"].input_smooth
        )
    )
    s = mods["off"]["layers.0.attention.qkv"].input_smooth
    n_off, n_min = mods["off"]["layers.0.attention_norm1"].weight, mods["min"]["layers.0.attention_norm1"].weight
    res["norm_fold_rel"] = rel(n_min, n_off / s)
    e = CFG.emb_dim
    res["v_rows_linked"] = bool(
        torch.equal(qkv.output_folded[2 * e :], o.input_folded.cpu()) and torch.all(qkv.output_folded[: 2 * e] == 1)
    )
    res["norm_linked"] = bool(
        torch.equal(mods["min"]["layers.0.attention_norm1"].ideogram4_fold, qkv.input_folded.cpu())
    )
    res["w3_rows_linked"] = bool(
        torch.equal(
            mods["min"]["layers.0.feed_forward.w3"].output_folded,
            mods["min"]["layers.0.feed_forward.w2"].input_folded.cpu(),
        )
    )
    res["ratio_w3_divides"] = mods["ratio"]["layers.0.feed_forward.w3"].input_divisor is not None
    outs, divides = {}, {}
    for k, d in dm.items():
        kernels.REGISTRY.launches.clear()
        with torch.no_grad():
            outs[k] = d(x, sigma, context=ctx)
        divides[k] = kernels.REGISTRY.launches["quant_divide"]
        res[f"divides_expected/{k}"] = _divides_per_forward(d)
    res["divides"] = divides
    res["min_vs_off"] = rel(outs["min"], outs["off"])
    res["ratio_vs_off"] = rel(outs["ratio"], outs["off"])
    # the panel: the folded default was loaded last; its records carry the notes (declared, then after a run)
    recs = {r.layer: r.reason for r in kernels.REGISTRY.layers("conditional")}
    res["note_adaln"] = recs["layers.0.adaln_modulation"]
    res["note_qkv"] = recs["layers.0.attention.qkv"]

    # LoRA: the same patches on the unfolded and the folded models, each folded one next to the unfolded one
    patches = _lora_patches(dm["off"])
    befores = {}
    for k in ("off", "ratio", "min"):
        with torch.no_grad():
            befores[k] = dm[k](x, sigma, context=ctx)
    loras = {}
    for k in ("off", "ratio", "min"):
        loras[k] = models[k].clone()
        loras[k].add_patches(patches, 1.0)
    # the re-quantized w1 / w3 of 'min' are not the unfolded model's weights: compared layer by layer elsewhere only
    exact = {"ratio": list(LORA_KEYS), "min": [key for key in LORA_KEYS if not key.endswith(("w1", "w3"))]}
    # full load: merged through convert_weight / set_weight, requantized, still int8
    comfy.model_management.load_models_gpu([loras["off"], loras["ratio"], loras["min"]])
    merged = {k: _real_weights(lo.model.diffusion_model) for k, lo in loras.items()}
    for k, lo in loras.items():
        lmods = dict(lo.model.diffusion_model.named_modules())
        linears = [key for key in LORA_KEYS if "norm" not in key]
        res[f"{k}/full_int8"] = all(int8_ops.is_int8_weight(lmods[key].weight) for key in linears)
        with torch.no_grad():
            outs[f"{k}/full"] = lo.model.diffusion_model(x, sigma, context=ctx)
        if k != "off":
            res[f"{k}/merged_vs_off"] = max(rel(merged[k][key], merged["off"][key]) for key in exact[k])
            res[f"{k}/full_layerwise_vs_off"] = _layerwise_vs_off(
                lo.model.diffusion_model, loras["off"].model.diffusion_model, exact[k]
            )
    comfy.model_management.unload_all_models()
    for k in loras:
        with torch.no_grad():
            res[f"{k}/after_unpatch"] = (dm[k](x, sigma, context=ctx) - befores[k]).abs().max().item()
    # lowvram: every module cast per call, the patches applied on the fly to the dequantized real weights
    for lo in loras.values():
        lo.patch_model(device_to=torch.device("cpu"), lowvram_model_memory=1)
    try:
        for k, lo in loras.items():
            with torch.no_grad():
                outs[f"{k}/lowvram"] = lo.model.diffusion_model(x, sigma, context=ctx)
            recs = {r.layer: r for r in kernels.REGISTRY.layers("conditional")}
            res[f"{k}/lowvram_paths"] = sorted({recs[key].path for key in LORA_KEYS if "norm" not in key})
            norm = dict(lo.model.diffusion_model.named_modules())["layers.0.attention_norm1"]
            res[f"{k}/lowvram_norm_patched"] = len(norm.weight_function) == 1
            if k != "off":
                res[f"{k}/lowvram_layerwise_vs_off"] = _layerwise_vs_off(
                    lo.model.diffusion_model, loras["off"].model.diffusion_model, exact[k]
                )
    finally:
        for lo in loras.values():
            lo.unpatch_model()
    for k in loras:
        with torch.no_grad():
            res[f"{k}/after_lowvram"] = (dm[k](x, sigma, context=ctx) - befores[k]).abs().max().item()
    res["lora_effect"] = rel(outs["off/full"], outs["off"])
    for k in ("ratio", "min"):
        res[f"{k}/full_vs_off"] = rel(outs[f"{k}/full"], outs["off/full"])
        res[f"{k}/lowvram_vs_off"] = rel(outs[f"{k}/lowvram"], outs["off/lowvram"])
    res["off/lowvram_vs_full"] = rel(outs["off/lowvram"], outs["off/full"])
    # a folded model saved and loaded again through the loader: the same model, nothing folded twice
    path = os.path.join(MODELS, "i4_smooth_saved.safetensors")
    comfy.utils.save_torch_file(
        {k: v.contiguous() for k, v in dm["min"].state_dict().items()},
        path,
        metadata={"ideogram4_config": CFG.to_json()},
    )
    saved, _, res["summary_saved"] = load("i4_smooth_saved.safetensors", "i4_smooth_saved.safetensors")
    with torch.no_grad():
        res["saved_max_abs"] = (saved.model.diffusion_model(x, sigma, context=ctx) - outs["min"]).abs().max().item()
    return res
