"""Host copies kept at the upload, so an unload drops the card copies (the CPU stands in for the card: the staged
upload's host-twin copies play the card tensors)."""

import torch
from comfy.quant_ops import QuantizedTensor

from comfy_checks.common import GPU, G, experiments, inputs, load, streaming_budget, write_all


def _tensors(dm):
    return dict((*dm.named_parameters(), *dm.named_buffers()))


def _data(t):
    return t._qdata if isinstance(t, QuantizedTensor) else t


def _bytes(t):
    return _data(t).detach().cpu().contiguous().reshape(-1).view(torch.uint8).clone()


def _pins_until_collected(load_model, device):
    """A kept host copy that is pinned stays pinned over an unload (a host tensor the model no longer keeps does
    not), and is unpinned once the model is collected. On a CPU nothing pins, so the pinned list is filled by hand
    and ComfyUI's unpin is recorded instead of run."""
    import gc

    import comfy.model_management as mm

    unpinned = []
    real_unpin = mm.unpin_memory
    mm.unpin_memory = lambda t: unpinned.append(t.data_ptr()) or True
    try:
        patcher = load_model()
        patcher.model.ideogram4_upload_any_device = not GPU  # the CPU stands in for the card
        patcher.patch_model(device_to=device, lowvram_model_memory=0)
        bm = patcher.model
        kept = _data(next(iter(bm.ideogram4_host_copies.values())))
        dropped = torch.zeros(16)
        patcher._pinned().extend([kept, dropped])
        patcher.unpatch_model(torch.device("cpu"))
        out = {
            "unpinned_at_unload": [p == dropped.data_ptr() for p in unpinned],
            "pinned_after_unload": [t.data_ptr() == kept.data_ptr() for t in bm.ideogram4_pinned],
        }
        del patcher, bm
        gc.collect()
        out["unpinned_when_collected"] = [p == kept.data_ptr() for p in unpinned[1:]]
    finally:
        mm.unpin_memory = real_unpin
    return out


def check_host_copies():
    """A full load keeps the host tensor of everything it uploaded; a large request outside the pack's runs unloads
    the MODEL whole (partially_unload frees nothing, so ComfyUI detaches it), a small one or one inside a run
    streams more; unpatching puts the host copies back (no tensor copied: the same storage) with the weights as
    loaded, and the next load computes as before. A LoRA-patched weight gets no host copy (ComfyUI restores its
    backup), so a patched MODEL is not covered."""
    from comfyui_ideogram4_int8.nodes.runtime import host_copies, streaming_patcher

    write_all()
    cond, _, _ = load("i4_w8a8.safetensors")
    cpu = torch.device("cpu")
    device = cond.load_device if GPU else cpu
    if not GPU:
        cond.model.ideogram4_upload_any_device = True
        cond.model.ideogram4_stream_any_device = True
    bm, dm = cond.model, cond.model.diffusion_model
    x, ctx, sigma, _ = inputs()
    x, ctx, sigma = (t.to(device) for t in (x, ctx, sigma))
    original = {k: _bytes(t) for k, t in _tensors(dm).items()}

    def forward():
        with torch.no_grad():
            return dm(x, sigma, context=ctx).float().cpu()

    def as_loaded():
        now = _tensors(dm)
        return set(now) == set(original) and all(torch.equal(_bytes(now[k]), v) for k, v in original.items())

    def on_copies():
        """How many of the model's tensors are their kept host copies (the same storage)."""
        copies = bm.ideogram4_host_copies
        return sum(
            1 for k, t in _tensors(bm).items() if k in copies and _data(copies[k]).data_ptr() == _data(t).data_ptr()
        )

    def uncovered(patcher):
        return sorted(
            k
            for k, t in _tensors(bm).items()
            if _data(t).device.type == device.type and host_copies.host_of(patcher, k, t) is None
        )

    res = {"tensors": len(_tensors(bm))}
    key = "diffusion_model.layers.0.attention.qkv.weight"
    cond.patch_model(device_to=device, lowvram_model_memory=0)
    ref = forward()
    loaded = bm.model_loaded_weight_memory
    res["kept"] = len(bm.ideogram4_host_copies)
    res["on_copies_loaded"] = on_copies()
    res["covers"] = host_copies.covers(cond)
    res["uncovered"] = uncovered(cond)
    # a sampling run holds the MODEL (ComfyUI's pre_run .. cleanup, e.g. DualModelGuider loading the other branch):
    # a large request shrinks it, never a whole unload (nothing would load it again before its pass)
    cond.pre_run()
    res["large_in_comfyui_run"] = cond.partially_unload(cpu, memory_to_free=int(loaded * 0.3))
    cond.cleanup()
    cond.unpatch_model(cpu)
    cond.patch_model(device_to=device, lowvram_model_memory=0)
    # a hook's in-place patch (its original in hook_backup): the host copy is no longer that weight's
    qkv = dm.layers[0].attention.qkv.weight
    cond.hook_backup[key] = (None, None)
    res["hooked_key_kept"] = host_copies.host_of(cond, key, qkv) is not None
    del cond.hook_backup[key]
    res["unhooked_key_kept"] = host_copies.host_of(cond, key, qkv) is not None
    res["large_outside"] = cond.partially_unload(cpu, memory_to_free=loaded // 2)
    res["small_outside"] = cond.partially_unload(cpu, memory_to_free=loaded // 20)
    res["streams_after_small"] = cond.stream is not None and len(cond.stream.plan.streamed) > 0
    with streaming_patcher.one_pass_per_branch([cond]):
        res["large_inside"] = cond.partially_unload(cpu, memory_to_free=int(bm.model_loaded_weight_memory * 0.3))
    res["max_abs_streamed"] = (forward() - ref).abs().max().item()
    # ComfyUI's load of the loaded MODEL with less room (a negative extra): it shrinks, never a whole unload
    cond.unpatch_model(cpu)
    cond.patch_model(device_to=device, lowvram_model_memory=0)
    before = bm.model_loaded_weight_memory
    cond.partially_load(device, extra_memory=-int(before * 0.3))
    res["shrunk_in_load"] = before - bm.model_loaded_weight_memory
    cond.unpatch_model(cpu)
    res["on_copies_unloaded"] = on_copies()
    res["on_host_unloaded"] = all(_data(t).device.type == "cpu" for t in _tensors(bm).values())
    res["as_loaded_unloaded"] = as_loaded()
    cond.patch_model(device_to=device, lowvram_model_memory=streaming_budget(cond, 2))
    res["max_abs_reloaded"] = (forward() - ref).abs().max().item()
    cond.unpatch_model(cpu)
    res["as_loaded_reloaded"] = as_loaded()
    # a LoRA on one weight: no host copy of it, the MODEL not covered, the original back after the unload
    real = dm.layers[0].attention.qkv.weight.dequantize()
    lora = cond.clone()
    lora.add_patches({key: (torch.randn(real.shape, generator=G) * 0.3 * real.float().std(),)}, 1.0)
    slack, host_copies.UNCOVERED_SLACK = host_copies.UNCOVERED_SLACK, 0  # the synthetic weights are small
    try:
        lora.patch_model(device_to=device, lowvram_model_memory=0)
        res["lora_changed"] = (forward() - ref).abs().max().item()
        res["lora_key_kept"] = host_copies.host_of(lora, key, dm.layers[0].attention.qkv.weight) is not None
        res["lora_uncovered"] = uncovered(lora)
        res["lora_covers"] = host_copies.covers(lora)
        res["lora_large_outside"] = lora.partially_unload(cpu, memory_to_free=int(bm.model_loaded_weight_memory * 0.3))
        lora.unpatch_model(cpu)
    finally:
        host_copies.UNCOVERED_SLACK = slack
    res["as_loaded_after_lora"] = as_loaded()
    res["pins"] = _pins_until_collected(lambda: load("i4_w8a8.safetensors")[0], device)
    # unloaded to the card itself (--gpu-only / --highvram: the offload device is the load device): nothing kept
    on_card = load("i4_w8a8.safetensors")[0]
    on_card.model.ideogram4_upload_any_device = not GPU
    on_card.offload_device = torch.device("cuda")  # only its kind is read before the unload
    on_card.patch_model(device_to=device, lowvram_model_memory=0)
    res["kept_offload_on_card"] = len(getattr(on_card.model, "ideogram4_host_copies", {}))
    res["covers_offload_on_card"] = host_copies.covers(on_card)
    on_card.offload_device = cpu
    on_card.unpatch_model(cpu)
    # host-copies=off: nothing kept
    del bm.ideogram4_host_copies
    with experiments(f"{host_copies.EXPERIMENT}=off"):
        cond.patch_model(device_to=device, lowvram_model_memory=0)
        res["kept_off"] = len(getattr(bm, "ideogram4_host_copies", {}))
        res["covers_off"] = host_copies.covers(cond)
        cond.unpatch_model(cpu)
    return res


def check_file_pages():
    """A streamed weight still in its checkpoint's file mapping (as safetensors hands it out) is copied to fresh host
    memory and the copy pinned (ideogram4/host_pages.py), with the same bytes, and kept as its host copy; a copy that
    does not pin is dropped (the file's pages stay); under ``pin-copy=off`` the weight is pinned in place. Each pin
    goes through ComfyUI's ``pin_memory`` under the pack's lock. Nothing pins on a CPU, so the decision and
    ``pin_memory`` are stood in for as on a card; the plan streams two blocks and computes as the resident model."""
    import threading

    import comfy.model_management as mm
    from comfyui_ideogram4_int8.ideogram4 import host_pages
    from comfyui_ideogram4_int8.kernels import settings
    from comfyui_ideogram4_int8.nodes.runtime import stream_pins, streaming_patcher

    write_all()
    x, ctx, sigma, _ = inputs()
    cpu = torch.device("cpu")
    patcher_cls = streaming_patcher.Ideogram4ModelPatcher
    real, real_pin, real_max = patcher_cls._copies_file_pages, mm.pin_memory, mm.MAX_PINNED_MEMORY
    patcher_cls._copies_file_pages = lambda self, device: settings.experiment(stream_pins.PIN_COPY) != "off"
    pins = {"ok": True, "asked": 0, "threads": set(), "held": []}

    def pin_memory(t):
        pins["asked"] += 1
        pins["held"].append(stream_pins.BOOKKEEPING._is_owned())
        pins["threads"].add(threading.current_thread().name)
        return pins["ok"]

    mm.pin_memory = pin_memory
    out = {"real_on_cpu": real(None, cpu)}
    try:
        for case, spec, ok in (
            ("copy", None, True),
            ("copy_refused", None, False),
            ("in_place", f"{stream_pins.PIN_COPY}=off", True),
            ("pinning_off", None, None),  # ComfyUI pins nothing (--disable-pinned-memory): no copy is made
        ):
            mm.MAX_PINNED_MEMORY = 0 if ok is None else 2**40  # a CPU-only ComfyUI pins nothing
            pins.update(ok=bool(ok), asked=0, threads=set(), held=[])
            cond, _, _ = load("i4_w8a8.safetensors")
            cond.model.ideogram4_upload_any_device = cond.model.ideogram4_stream_any_device = True
            dm = cond.model.diffusion_model
            qkv = [b.attention.qkv for b in dm.layers]
            before = [host_pages.FileMappings().holds(_data(m.weight)) for m in qkv]
            original = [_bytes(m.weight) for m in qkv]
            with torch.no_grad():
                want = dm(x, sigma, context=ctx).float()
            with experiments(spec):
                cond.patch_model(device_to=cpu, lowvram_model_memory=streaming_budget(cond, 2))
            streamed = set(cond.stream.plan.streamed)
            maps = host_pages.FileMappings()
            kept = cond.model.ideogram4_host_copies
            with torch.no_grad():
                got = dm(x, sigma, context=ctx).float()
            out[case] = {
                "mapped_before": before,
                "streamed": sorted(streamed),
                "mapped_after": [maps.holds(_data(m.weight)) for m in qkv],
                "same_bytes": [torch.equal(_bytes(m.weight), o) for m, o in zip(qkv, original, strict=True)],
                "kept_is_weight": [
                    _data(kept[f"diffusion_model.layers.{i}.attention.qkv.weight"]).data_ptr()
                    == _data(qkv[i].weight).data_ptr()
                    for i in sorted(streamed)
                ],
                "max_abs": (got - want).abs().max().item(),
                "pins_asked": pins["asked"],
                "pin_threads": sorted(pins["threads"]),
                "pins_under_lock": pins["held"],
                "pinned_recorded": len(cond._pinned()),
            }
            cond.unpatch_model(cpu)
    finally:
        patcher_cls._copies_file_pages, mm.pin_memory, mm.MAX_PINNED_MEMORY = real, real_pin, real_max
    with stream_pins.BOOKKEEPING:  # an unpin reached from inside ComfyUI's load on the same thread goes through
        out["reentrant"] = stream_pins.BOOKKEEPING.acquire(timeout=1)
        if out["reentrant"]:
            stream_pins.BOOKKEEPING.release()
    # the maps reader: only private mappings of a file count
    text = (
        "7f0000000000-7f0000100000 rw-p 00000000 fe:00 12 /models/a.safetensors\n"
        "7f0000100000-7f0000200000 rw-s 00000000 fe:00 13 /dev/shm/b\n"
        "7f0000200000-7f0000300000 rw-p 00000000 00:00 0 [heap]\n"
        "7f0000300000-7f0000400000 rw-p 00000000 00:00 0\n"
    )
    fake = host_pages.FileMappings(text)
    probe = torch.empty(0)
    out["parsed"] = [fake._starts, fake._ends]
    out["fresh_tensor"] = host_pages.FileMappings().holds(torch.ones(1 << 16))
    out["empty_tensor"] = host_pages.FileMappings(text).holds(probe)
    return out
