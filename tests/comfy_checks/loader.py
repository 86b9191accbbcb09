"""The loader and patch nodes: partial loads, ComfyUI's patch nodes, refused inputs, progress and panel hooks."""

import os

import comfy.model_base
import comfy.model_management
import comfy.model_patcher
import comfy.supported_models
import comfy.utils
import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.ideogram4 import synthetic
from comfyui_ideogram4_int8.kernels import model_notes
from comfyui_ideogram4_int8.nodes import loader_nodes, patch_nodes, sampler_nodes
from comfyui_ideogram4_int8.nodes.runtime import int8_ops, native_model

from comfy_checks.common import (
    CASES,
    CFG,
    MODELS,
    G,
    demo_sizes,
    forward_cases,
    inputs,
    latent_node,
    load,
    native_unet,
    reference,
    rel,
    seed,
    weights,
    write_all,
)


def check_offload():
    """Partial (lowvram) load without patches keeps the int8 path and the same output; clone, cached_patcher_init,
    state_dict round trip."""
    write_all()
    cond, _, _ = load("i4_w8a8.safetensors")
    x, ctx, sigma, mask = inputs()
    dm = cond.model.diffusion_model
    with torch.no_grad():
        full = dm(x, sigma, context=ctx)
    res = {"model_size": cond.model_size()}
    res["float_size"] = sum(4 * p.numel() for p in dm.parameters())
    cond.patch_model(device_to=torch.device("cpu"), lowvram_model_memory=1)
    try:
        res["cast_modules"] = sum(bool(getattr(m, "comfy_cast_weights", False)) for m in dm.modules())
        with torch.no_grad():
            res["lowvram_max_abs"] = (dm(x, sigma, context=ctx) - full).abs().max().item()
        rec = {r.layer: r.path for r in kernels.REGISTRY.layers("conditional")}
        res["lowvram_qkv_path"] = rec["layers.0.attention.qkv"]
    finally:
        cond.unpatch_model()
    clone = cond.clone()
    with torch.no_grad():
        res["clone_max_abs"] = (clone.model.diffusion_model(x, sigma, context=ctx) - full).abs().max().item()
    fn, fargs = cond.cached_patcher_init[:2]
    again = fn(*fargs, disable_dynamic=True)
    with torch.no_grad():
        res["reinit_max_abs"] = (again.model.diffusion_model(x, sigma, context=ctx) - full).abs().max().item()
    res["reinit_is_new_model"] = again.model is not cond.model
    dm.to(torch.device("cpu"))
    res["after_to_int8"] = int8_ops.is_int8_weight(dm.layers[0].attention.qkv.weight)
    sd = dm.state_dict()
    res["state_dict_smooth_keys"] = sum(k.endswith(".input_smooth") for k in sd)
    res["state_dict_quant_keys"] = sum(k.endswith(".comfy_quant") for k in sd)
    path = os.path.join(MODELS, "i4_saved.safetensors")
    # (the demo config's RoPE sections cannot be inferred from shapes; the full model's can, so metadata is only
    # needed here)
    comfy.utils.save_torch_file(
        {k: v.contiguous() for k, v in sd.items()}, path, metadata={"ideogram4_config": CFG.to_json()}
    )
    saved, _, _ = load("i4_saved.safetensors", "i4_saved.safetensors")
    with torch.no_grad():
        res["saved_max_abs"] = (saved.model.diffusion_model(x, sigma, context=ctx) - full).abs().max().item()
    return res


def check_patch():
    files, _ = write_all()
    x, ctx, sigma, mask = inputs()
    res = {}
    for fmt, fname in (
        ("int8_convrot", "i4_int8_convrot.safetensors"),
        ("fp8", "i4_fp8_scaled.safetensors"),
        ("bf16", "i4_bf16.safetensors"),
    ):
        path = os.path.join(MODELS, fname)
        native = native_unet(path, torch.float32 if fmt == "bf16" else None)
        out = patch_nodes.Ideogram4Int8Patch.execute(model=native, label="conditional", gemm_path="auto")
        patched, report = out.result
        ref = reference(path, "conditional")
        ours = forward_cases(patched.model.diffusion_model, x, ctx, sigma, mask)
        want = forward_cases(ref, x, ctx, sigma, mask)
        native_dm = native.model.diffusion_model
        nat = {k: v.float() for k, v in forward_cases(native_dm, x, ctx, sigma, mask).items()}
        for case in CASES:
            res[f"{fmt}/{case}/vs_reference"] = rel(ours[case], want[case])
            res[f"{fmt}/{case}/vs_native"] = rel(ours[case], nat[case])
        res[f"{fmt}/report"] = report
        res[f"{fmt}/int8_layers"] = sum(
            int8_ops.is_int8_weight(m.weight) for m in int8_ops.int8_linears(patched.model.diffusion_model).values()
        )
        again = patch_nodes.Ideogram4Int8Patch.execute(model=patched, label="conditional", gemm_path="auto").result
        res[f"{fmt}/repatch_same_object"] = again[0] is patched
        fn, fargs = patched.cached_patcher_init[:2]
        with demo_sizes():
            rebuilt = fn(*fargs, disable_dynamic=True)
        with torch.no_grad():
            res[f"{fmt}/reinit_max_abs"] = (
                (
                    rebuilt.model.diffusion_model(x, sigma, context=ctx)
                    - patched.model.diffusion_model(x, sigma, context=ctx)
                )
                .abs()
                .max()
                .item()
            )
    # a LoRA patch on the source MODEL carries over
    native = native_unet(os.path.join(MODELS, "i4_int8_convrot.safetensors"))
    lora = native.clone()
    w = native.model.diffusion_model.layers[1].attention.o.weight
    lora.add_patches({"diffusion_model.layers.1.attention.o.weight": (0.3 * torch.randn(w.shape, generator=G),)})
    # the LoRA model ran before (weights merged in place on load): the patch node must read the pristine weights
    comfy.model_management.load_models_gpu([lora])
    with torch.no_grad():
        want_lora = lora.model.diffusion_model(x, sigma, context=ctx).float()
    patched = patch_nodes.Ideogram4Int8Patch.execute(model=lora, label="conditional", gemm_path="auto").result[0]
    res["lora_patches_kept"] = len(patched.patches)
    comfy.model_management.load_models_gpu([patched])
    with torch.no_grad():
        res["lora_patched_vs_native_lora"] = rel(patched.model.diffusion_model(x, sigma, context=ctx), want_lora)
        res["lora_native_vs_plain"] = rel(native.model.diffusion_model(x, sigma, context=ctx).float(), want_lora)
    comfy.model_management.unload_all_models()
    return res


def check_bad_inputs():
    write_all()
    errors = {}

    def expect(name, fn):
        try:
            fn()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001
            errors[name] = f"{type(exc).__name__}: {exc}"

    comfy.utils.save_torch_file(
        {"encoder.conv_in.weight": torch.randn(8, 3, 3, 3)}, os.path.join(MODELS, "not_ideogram_vae.safetensors")
    )
    with open(os.path.join(MODELS, "truncated.safetensors"), "wb") as f:
        f.write(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a":')
    expect("wrong_kind", lambda: load("not_ideogram_vae.safetensors"))
    expect("truncated", lambda: load("truncated.safetensors"))
    expect("single_branch_no_uncond", lambda: load("i4_fp8_scaled.safetensors"))
    nobase = {"conditional": weights(seed), "unconditional": weights(seed + 1)}
    synthetic.write_w8a8(os.path.join(MODELS, "i4_nobase.safetensors"), nobase, CFG, include_others=False)
    expect("missing_base", lambda: load("i4_nobase.safetensors"))
    for b in nobase:
        synthetic.write_float(
            os.path.join(MODELS, f"i4_base_{b}.safetensors"), nobase[b], CFG, only=synthetic.is_nonlinear_or_top(CFG)
        )
    # the second branch fails while loading (a NaN scale): the first one must not survive, nor its panel records
    from safetensors.torch import load_file, save_file

    bad = load_file(os.path.join(MODELS, "i4_unconditional_int8_convrot.safetensors"))
    bad["layers.2.attention.o.weight_scale"][5] = float("nan")
    save_file(
        bad, os.path.join(MODELS, "i4_unconditional_bad.safetensors"), metadata={"ideogram4_config": CFG.to_json()}
    )
    model_notes.forget()
    expect("second_branch_fails", lambda: load("i4_int8_convrot.safetensors", "i4_unconditional_bad.safetensors"))
    errors["registry_after_failed_load"] = kernels.REGISTRY.models()
    expect("hf_empty", lambda: load(loader_nodes.HF_CHOICE))
    expect(
        "hf_offline_missing",
        lambda: loader_nodes.Ideogram4Int8Loader.execute(
            weights=loader_nodes.HF_CHOICE,
            unconditional_weights=loader_nodes.SAME_FILE,
            base="none",
            unconditional_base="none",
            compute_dtype="fp32",
            gemm_path="auto",
            hf_repo_id="someone/ideogram-4-int8",
            hf_filename="w8a8.safetensors",
        ),
    )
    expect("forced_triton_on_cpu", lambda: load("i4_w8a8.safetensors", path=kernels.PATH_TRITON))
    free_host = native_model.free_host_memory
    native_model.free_host_memory = lambda: 5 * 10**8  # 0.5 GB free: refused before reading anything
    try:
        expect("too_little_ram", lambda: load("i4_w8a8.safetensors"))
        native = native_unet(os.path.join(MODELS, "i4_fp8_scaled.safetensors"), None)
        expect(
            "patch_too_little_ram",
            lambda: patch_nodes.Ideogram4Int8Patch.execute(model=native, label="conditional", gemm_path="auto"),
        )
    finally:
        native_model.free_host_memory = free_host
    errors["free_host_positive"] = free_host() > 0
    cond, uncond, _ = load("i4_w8a8.safetensors")
    other_cfg = comfy.supported_models.SD15({"disable_unet_model_creation": True, "in_channels": 4})
    other = comfy.model_patcher.ModelPatcher(
        comfy.model_base.BaseModel(other_cfg), torch.device("cpu"), torch.device("cpu")
    )
    ctx = torch.randn(1, 5, CFG.llm_features_dim)
    expect(
        "patch_non_ideogram",
        lambda: patch_nodes.Ideogram4Int8Patch.execute(model=other, label="conditional", gemm_path="auto"),
    )
    expect("sampler_non_ideogram", lambda: latent_node(other, uncond, ctx, 0))
    expect("sampler_non_ideogram_negative", lambda: latent_node(cond, other, ctx, 0))
    expect("sampler_clip_l_conditioning", lambda: latent_node(cond, uncond, torch.randn(1, 77, 768), 0))
    expect(
        "sampler_zero_out_none",
        lambda: sampler_nodes.Ideogram4Int8Sampler.execute(
            model=cond, model_negative=uncond, positive=[[None, {}]], seed=0, preset="Turbo 12", width=256, height=256
        ),
    )
    expect("size_not_multiple", lambda: latent_node(cond, uncond, ctx, 0, w=1000, h=1024))
    expect("size_aspect", lambda: latent_node(cond, uncond, ctx, 0, w=2048, h=256 + 64))
    expect("size_small", lambda: latent_node(cond, uncond, ctx, 0, w=128, h=256))
    expect(
        "custom_polish_too_many", lambda: latent_node(cond, uncond, ctx, 0, preset="custom", steps=4, polish_steps=6)
    )
    expect(
        "with_base_ok",
        lambda: loader_nodes.Ideogram4Int8Loader.execute(
            weights="i4_nobase.safetensors",
            unconditional_weights=loader_nodes.SAME_FILE,
            base="i4_base_conditional.safetensors",
            unconditional_base="i4_base_unconditional.safetensors",
            compute_dtype="fp32",
            gemm_path="auto",
        ),
    )
    return errors


def check_hooks():
    """Progress bar while loading and sampling; the panel's publish() is called and may fail without harm."""
    write_all()
    from comfyui_ideogram4_int8.nodes import status_nodes

    updates, events = [], []
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: updates.append((value, total)))
    status_nodes.publish = lambda event, models=None, *where, **named: events.append((event, models))
    try:
        cond, uncond, _ = load("i4_w8a8.safetensors")
        load_updates = list(updates)
        updates.clear()
        ctx = torch.randn(1, 4, CFG.llm_features_dim, generator=G)
        latent_node(cond, uncond, ctx, 3, preset="custom", steps=3)
        sample_updates = list(updates)

        def broken(event, *args, **kwargs):
            raise RuntimeError("panel is down")

        status_nodes.publish = broken
        latent_node(cond, uncond, ctx, 4, preset="custom", steps=2)
        load("i4_w8a8.safetensors", dtype="bf16")
        survived = True
    finally:
        comfy.utils.set_progress_bar_global_hook(None)
        del status_nodes.publish
    return {
        "load_updates": len(load_updates),
        "load_last": load_updates[-1] if load_updates else None,
        "load_monotonic": all(a[0] <= b[0] for a, b in zip(load_updates, load_updates[1:], strict=False)),
        "sample_updates": sample_updates,
        "events": events,
        "survived_broken_publish": survived,
        "registry_last_run": kernels.REGISTRY.last_run(),
    }
