"""The staged upload of what ComfyUI's load moves to the device unchanged (pinned buffers on a GPU, host copies
standing in for them on a CPU)."""

import comfy.model_management
import torch
from comfy.quant_ops import QuantizedTensor
from comfyui_ideogram4_int8.kernels import model_notes, settings

from comfy_checks.common import GPU, G, env_var, experiments, inputs, load, streaming_budget, write_all


def _tensors(dm):
    """Every parameter and buffer of ``dm`` by name (an int8 QuantizedTensor's data, and its scale as ``#scale``)."""
    out = {}
    for name, t in (*dm.named_parameters(), *dm.named_buffers()):
        if isinstance(t, QuantizedTensor):
            out[name], out[f"{name}#scale"] = t._qdata, t._params.scale
        else:
            out[name] = t
    return out


def _bytes(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).clone()


def _same_bytes(dm, original):
    now = _tensors(dm)
    return set(now) == set(original) and all(torch.equal(_bytes(now[k]), v) for k, v in original.items())


def _report(calls):
    """The first upload among ``calls`` ((report, planned keys) per ``before_load``), as JSON."""
    r = next((r for r, _ in calls if r is not None), None)
    if r is None:
        return None
    return {"path": r.path, "tensors": r.tensors, "nbytes": r.nbytes, "pinned": r.pinned, "queued": r.queued}


def _upload_cases(cond, device, lora_patch, inp, calls):
    """One mode's loads (the pack's upload, or ComfyUI's own move under upload=comfyui): what each load did, the
    model's output after it, and what stayed after the model went back to the host."""
    from comfyui_ideogram4_int8.nodes.runtime import stream_pieces, weight_upload

    dm = cond.model.diffusion_model
    cpu = torch.device("cpu")
    x, ctx, sigma = (t.to(device) for t in inp)
    original = {k: _bytes(t) for k, t in _tensors(dm).items()}
    mm = comfy.model_management
    gpu = device.type == "cuda"

    def allocated():
        return torch.cuda.memory_allocated(device) if gpu else 0

    def pinned_now():
        """ComfyUI's count of pinned bytes, and the bytes of the host copies the pack keeps pinned."""
        kept = sum(t.nbytes for t in getattr(cond.model, "ideogram4_pinned", ()))
        return mm.TOTAL_PINNED_MEMORY, kept

    def loaded(patcher, budget, name):
        calls.clear()
        ptrs = {k: t.data_ptr() for k, t in _tensors(cond.model).items()}
        base, pinned = allocated(), pinned_now()
        patches = []  # the keys ComfyUI's load (and streaming) patched on the device
        real_patch = patcher.patch_weight_to_device
        patcher.patch_weight_to_device = lambda key, *a, **k: patches.append(key) or real_patch(key, *a, **k)
        try:
            patcher.patch_model(device_to=device, lowvram_model_memory=budget)
        finally:
            del patcher.patch_weight_to_device
        planned = calls[0][1] if calls else []
        now = _tensors(cond.model)
        case = {
            "report": _report(calls),
            "planned": len(planned),
            "note": model_notes.notes("conditional").get(weight_upload.NOTE_KIND),
            "copied_planned": sum(now[k].data_ptr() != ptrs[k] for k in planned),
            "copied_other": sum(now[k].data_ptr() != p for k, p in ptrs.items() if k not in planned and "#" not in k),
            "on_device": sum(t.device.type == device.type for t in _tensors(dm).values()),
            "tensors": len(original),
            "weights_as_loaded": _same_bytes(dm, original),
            "allocated": allocated() - base,
            "patch_calls": len(patches),
        }
        with torch.no_grad():
            outs[name] = dm(x, sigma, context=ctx).float().cpu()
        return case, planned, base, pinned

    def unloaded(patcher, case, base, pinned):
        patcher.unpatch_model(cpu)
        case["on_host_after"] = all(t.device.type == "cpu" for t in _tensors(dm).values())
        case["weights_after"] = _same_bytes(dm, original)
        case["allocated_after"] = allocated() - base
        now = pinned_now()
        case["pinned_after"], case["kept_pinned_after"] = now[0] - pinned[0], now[1] - pinned[1]
        case["comfy_pinned_keys_after"] = len(patcher.pinned)
        return case

    res, outs = {}, {}
    case, _, base, pinned = loaded(cond, 0, "full")  # ComfyUI's full load
    res["full"] = unloaded(cond, case, base, pinned)
    lora = cond.clone()  # a LoRA-patched full load: the patched module stays on ComfyUI's path
    key, patch = lora_patch
    lora.add_patches({key: (patch,)}, 1.0)
    case, planned, base, pinned = loaded(lora, 0, "lora")
    case["module_keys_planned"] = sum(k.startswith(key.rsplit(".", 1)[0] + ".") for k in planned)
    res["lora"] = unloaded(lora, case, base, pinned)
    # the resident part of a streamed load: the streamed blocks' weights stay on the host
    budget = streaming_budget(cond, 2)
    case, planned, base, pinned = loaded(cond, budget, "streamed")
    stream = cond.model.ideogram4_stream
    streamed = [m for i in stream.plan.streamed for _, m in stream_pieces.streamable(dm.layers[i])]
    case["streamed_blocks"] = len(stream.plan.streamed)
    case["streamed_weights_on_host"] = all(stream_pieces.host_data(m.weight).device.type == "cpu" for m in streamed)
    streamed_keys = {
        f"diffusion_model.layers.{i}.{n}.weight"
        for i in stream.plan.streamed
        for n, _ in stream_pieces.streamable(dm.layers[i])
    }
    case["planned_streamed"] = len(streamed_keys & set(planned))
    case["planned_keys"] = len(planned)
    res["streamed"] = unloaded(cond, case, base, pinned)
    # ComfyUI's own partial unload (streaming off) pins what it offloads; the next full load copies it straight
    # from pinned memory, then unpins it as ComfyUI's load does
    with env_var(settings.STREAM, "off"), experiments("host-copies=off"):  # a whole unload would take its place
        case, _, base, pinned = loaded(cond, 0, "offload")
        case["freed"] = cond.partially_unload(cpu, memory_to_free=cond.model_size() // 2) > 0
        case["comfy_pinned_keys_unloaded"] = len(cond.pinned)
        calls.clear()
        cond.partially_load(device, extra_memory=1e32)
        case["reload_report"] = _report(calls)
        case["comfy_pinned_keys_reloaded"] = len(cond.pinned)
        case["pinned_reloaded"] = mm.TOTAL_PINNED_MEMORY - pinned[0]
        case["on_device_reloaded"] = sum(t.device.type == device.type for t in _tensors(dm).values())
        with torch.no_grad():
            outs["offload"] = dm(x, sigma, context=ctx).float().cpu()
        res["offload"] = unloaded(cond, case, base, pinned)
    return res, outs


def check_upload():
    """What ComfyUI's load moves to the device unchanged goes there first in one staged copy
    (nodes.runtime.weight_upload): on a GPU (COMFY_GPU=1) through pinned staging buffers, on the CPU (standing in for
    the card) through the same plan with host copies. A full load, a LoRA-patched full load, the resident part of a
    streamed load and a reload after ComfyUI's partial unload give the same weights and output as ComfyUI's own move
    (upload=comfyui); the LoRA module and the streamed blocks keep their paths; unpatching moves everything back,
    nothing stays on the card or pinned."""
    from comfyui_ideogram4_int8.nodes.runtime import weight_upload

    write_all()
    cond, _, _ = load("i4_w8a8.safetensors")
    device = cond.load_device if GPU else torch.device("cpu")
    if not GPU:  # the CPU stands in for the card: every host tensor is copied, the plan streams on a CPU
        cond.model.ideogram4_upload_any_device = True
        cond.model.ideogram4_stream_any_device = True
    key = "diffusion_model.layers.0.attention.qkv.weight"
    real = cond.model.diffusion_model.layers[0].attention.qkv.weight.dequantize()
    lora_patch = (key, torch.randn(real.shape, generator=G) * 0.3 * real.float().std())
    calls = []  # (report, the keys planned) per before_load
    spied = weight_upload.before_load

    def spy(patcher, device, whole_model):
        keys = [k for k, *_ in weight_upload.planned(patcher, whole_model)]
        calls.append((spied(patcher, device, whole_model=whole_model), keys))
        return calls[-1][0]

    weight_upload.before_load = spy
    x, ctx, sigma, _ = inputs()
    res = {"device": device.type, "pinned_memory_limit": comfy.model_management.MAX_PINNED_MEMORY > 0}
    outs = {}
    with experiments(f"{weight_upload.EXPERIMENT}=comfyui"):  # what a first forward leaves behind, before measuring
        cond.patch_model(device_to=device, lowvram_model_memory=0)
        with torch.no_grad():
            cond.model.diffusion_model(*(t.to(device) for t in (x, sigma)), context=ctx.to(device))
        cond.unpatch_model(torch.device("cpu"))
    try:
        for mode, entries in (
            ("pack", ()),
            ("overlap", (f"{weight_upload.EXPERIMENT}={weight_upload.OVERLAP}",)),
            ("comfyui", (f"{weight_upload.EXPERIMENT}=comfyui",)),
        ):
            with experiments(*entries):
                res[mode], outs[mode] = _upload_cases(cond, device, lora_patch, (x, ctx, sigma), calls)
    finally:
        weight_upload.before_load = spied
    res["max_abs_vs_comfyui"] = {k: (v - outs["comfyui"][k]).abs().max().item() for k, v in outs["pack"].items()}
    res["overlap_max_abs_vs_comfyui"] = {
        k: (v - outs["comfyui"][k]).abs().max().item() for k, v in outs["overlap"].items()
    }
    res["lora_changed_output"] = (outs["pack"]["lora"] - outs["pack"]["full"]).abs().max().item()
    return res
