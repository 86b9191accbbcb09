"""Where the branches and the context live: the Branch Device node, concurrent passes, resident conditionings."""

import os

import torch
from comfyui_ideogram4_int8 import kernels
from comfyui_ideogram4_int8.kernels import model_notes, settings
from comfyui_ideogram4_int8.nodes import sampler_nodes

from comfy_checks.common import CFG, GPU, G, env_var, experiments, inputs, latent_node, load, write_all


def check_branch_device():
    """The Branch Device node and the sampler's concurrent passes: on a machine without a second GPU the node leaves
    the MODEL as it is and says so; run concurrently (ComfyUI's MultiGPUThreadPool, one device standing in for two)
    the unconditional pass runs in the worker thread and the latent equals the one-after-the-other run bit for bit;
    a failure in the worker's pass reaches the sampler and leaves nothing behind; an input on another card than the
    placed model gets an error naming the cause. With COMFY_GPU=1 and two CUDA devices: the real placement."""
    import functools
    import threading

    from comfyui_ideogram4_int8.nodes import branch_device_nodes as branch_device

    write_all()
    cond, uncond, _ = load("i4_w8a8.safetensors")
    ctx = torch.randn(1, 7, CFG.llm_features_dim, generator=G)
    s = int(torch.randint(0, 2**31, (1,), generator=G))
    res = {}
    for choice in ("second GPU", "cuda:3"):
        out = branch_device.Ideogram4Int8BranchDevice.execute(model_negative=uncond, device=choice)
        res[f"{choice}/same_object"] = out.result[0] is uncond
        res[f"{choice}/note"] = out.result[1]
    res["panel_note"] = model_notes.notes("unconditional").get(branch_device.NOTE_KIND)
    try:
        branch_device.Ideogram4Int8BranchDevice.execute(model_negative=uncond, device="cuda:9")
        res["bad_choice"] = None
    except Exception as exc:  # noqa: BLE001
        res["bad_choice"] = f"{type(exc).__name__}: {exc}"
    threads = {"conditional": set(), "unconditional": set()}
    hooks = [
        m.model.diffusion_model.register_forward_pre_hook(
            lambda *_, k=k: threads[k].add(threading.current_thread() is threading.main_thread())
        )
        for k, m in (("conditional", cond), ("unconditional", uncond))
    ]
    one_after_other = latent_node(cond, uncond, ctx, s)
    original = sampler_nodes.PerStepGuidanceGuider
    sampler_nodes.PerStepGuidanceGuider = functools.partial(original, concurrent=True)
    try:
        for k in threads:
            threads[k].clear()
        side_by_side = latent_node(cond, uncond, ctx, s)
        res["threads"] = {k: sorted(v) for k, v in threads.items()}  # True: the main thread
        res["concurrent_max_abs"] = (side_by_side - one_after_other).abs().max().item()

        def boom(*_):
            raise RuntimeError("unconditional pass failed on purpose")

        h = uncond.model.diffusion_model.register_forward_pre_hook(boom)
        try:
            latent_node(cond, uncond, ctx, s)
            res["worker_error"] = None
        except RuntimeError as exc:
            res["worker_error"] = str(exc)
        finally:
            h.remove()
        res["after_error_max_abs"] = (latent_node(cond, uncond, ctx, s) - one_after_other).abs().max().item()
    finally:
        sampler_nodes.PerStepGuidanceGuider = original
        for h in hooks:
            h.remove()
    # the guard of a placed model: its input on another device than the one it computes on
    guard = branch_device._InputOnItsCard(torch.device("cpu"))
    try:
        guard(uncond.model.diffusion_model, (torch.zeros(1, device="meta"),), {})
        res["guard"] = None
    except RuntimeError as exc:
        res["guard"] = str(exc)
    # the wrapper moves the pass's inputs to its card and the prediction back (CPU -> CPU here: same values)
    seen = {}

    def executor(x, t, *args, **kwargs):
        seen["devices"] = [str(x.device), str(t.device), str(kwargs["transformer_options"]["sigmas"].device)]
        return x * 2

    wrapped = branch_device.RunOnDevice(torch.device("cpu"))
    out = wrapped(executor, torch.ones(2), torch.ones(1), transformer_options={"sigmas": torch.ones(1), "f": len})
    res["wrapper"] = {"devices": seen["devices"], "out": out.tolist()}
    if os.environ.get("COMFY_GPU") == "1" and torch.cuda.device_count() >= 2:
        res["gpu"] = _branch_device_gpu(cond, uncond, ctx, s)
    return res


def _branch_device_gpu(cond, uncond, ctx, s):
    """Two CUDA devices: the latent with the unconditional MODEL on cuda:1 against both on cuda:0, and where each
    pass ran."""
    from comfyui_ideogram4_int8.nodes import branch_device_nodes as branch_device

    ran = {"conditional": set(), "unconditional": set()}
    one = latent_node(cond, uncond, ctx, s).double()
    placed, note = branch_device.place(uncond, "second GPU")
    hooks = [
        m.model.diffusion_model.register_forward_pre_hook(lambda mod, a, k=k: ran[k].add(str(a[0].device)))
        for k, m in (("conditional", cond), ("unconditional", placed))
    ]
    try:
        model_notes.forget()
        two = latent_node(cond, placed, ctx, s).double()
    finally:
        for h in hooks:
            h.remove()
    cos = torch.nn.functional.cosine_similarity(one.flatten(), two.flatten(), dim=0).item()
    return {
        "note": note,
        "cosine": cos,
        "ran_on": {k: sorted(v) for k, v in ran.items()},
        "paths": {label: sorted({r.path for r in kernels.REGISTRY.layers(label)}) for label in ran},
    }


def check_resident_conds():
    """The context is put on the sampling device once per run (nodes/runtime/resident_conds.py). Anywhere: through
    ComfyUI's own ``encode_model_conds``, a CPU float32 context comes back as is for a CPU run, and for another device
    in the model's inference dtype, where ``_apply_model``'s per-call cast returns it unchanged; installing twice wraps
    once. With COMFY_GPU=1: every model call of a sampling run gets the same CUDA tensor (no per-call copy) and the
    latent equals the one sampled with ComfyUI's own extra_conds, bit for bit."""
    import comfy.model_management
    import comfy.samplers
    from comfyui_ideogram4_int8.nodes.runtime import resident_conds

    write_all()
    x, ctx, _, _ = inputs(batch=1)
    cond, uncond, _ = load("i4_w8a8.safetensors", dtype="bf16")
    model = cond.model
    res = {"wrapped": getattr(model.extra_conds, "ideogram4_resident", False)}
    inner = model.extra_conds
    resident_conds.install(model)
    res["wrapped_once"] = model.extra_conds is inner

    def encoded(device):
        conds = [{"cross_attn": ctx, "model_conds": {}}]
        out = comfy.samplers.encode_model_conds(model.extra_conds, conds, x, device, "positive")
        return out[0]["model_conds"]["c_crossattn"].cond

    on_cpu = encoded(torch.device("cpu"))
    res["cpu_same_tensor"] = on_cpu is ctx
    on_meta = encoded(torch.device("meta"))  # any non-CPU device: the cast happens here, not per call
    dtype = model.get_dtype_inference()
    res["meta"] = [str(on_meta.device), str(on_meta.dtype), str(dtype), list(on_meta.shape) == list(ctx.shape)]
    res["meta_cast_is_noop"] = comfy.model_management.cast_to_device(on_meta, on_meta.device, dtype) is on_meta
    with experiments(resident_conds.EXPERIMENT):  # the A/B switch: ComfyUI's per-call cast
        res["switched_off_same_tensor"] = encoded(torch.device("meta")) is ctx
    if GPU:
        seen, real = [], comfy.model_management.cast_to_device

        def recording(tensor, device, dtype, copy=False):
            out = real(tensor, device, dtype, copy=copy)
            if torch.is_tensor(tensor) and tensor.shape[-1] == ctx.shape[-1]:  # the context's per-call cast
                seen.append([tensor.device.type, out is tensor])
            return out

        s = int(torch.randint(0, 2**31, (1,), generator=G))
        comfy.model_management.cast_to_device = recording
        try:
            with env_var(settings.CUDA_GRAPHS, "0"), torch.inference_mode():
                ours = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=256, h=256)
                res["gpu/casts"] = sorted({str(c) for c in seen})
                res["gpu/calls"] = len(seen)
                seen.clear()
                del model.extra_conds  # ComfyUI's own: a copy per call
                theirs = latent_node(cond, uncond, ctx, s, preset="Turbo 12", w=256, h=256)
                res["gpu/own_casts"] = sorted({str(c) for c in seen})
        finally:
            comfy.model_management.cast_to_device = real
        res["gpu/equal"] = bool(torch.equal(ours, theirs))
    return res
