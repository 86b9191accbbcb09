"""Host weights pinned ahead of a MODEL's first load (``nodes/runtime/pin_ahead.py``). On a CPU nothing pins:
ComfyUI's pin book is faked (each pin recorded and counted in its total) and the CPU stands in for the card; on a GPU
(COMFY_GPU=1) the pins are real and the first load's upload is only queued."""

import functools
import gc
import threading

import torch
from comfy.quant_ops import QuantizedTensor

from comfy_checks.common import GPU, experiments, inputs, load, write_all


def _data(t):
    return t._qdata if isinstance(t, QuantizedTensor) else t


def _bytes(t):
    return _data(t).detach().cpu().contiguous().reshape(-1).view(torch.uint8).clone()


def _name(key):
    return key.removeprefix("diffusion_model.")


def _weights(dm):
    return {n: p for n, p in dm.named_parameters()}


class _FakePins:
    """ComfyUI's pin_memory / unpin_memory on a CPU: recorded and counted in its total; ``hold_at``: the n-th pin
    waits for ``release`` (a load then stops the worker while that pin is under way)."""

    def __init__(self, mm):
        self.mm = mm
        self.pins, self.unpins, self.threads, self.locked = [], [], set(), []
        self.hold_at = None
        self.in_pin, self.release = threading.Event(), threading.Event()

    def pin(self, t):
        from comfyui_ideogram4_int8.nodes.runtime import stream_pins

        self.pins.append(t.data_ptr())
        self.threads.add(threading.current_thread().name)
        self.locked.append(stream_pins.BOOKKEEPING._is_owned())
        self.mm.TOTAL_PINNED_MEMORY += t.nbytes
        if self.hold_at is not None and len(self.pins) == self.hold_at:
            self.in_pin.set()
            self.release.wait(timeout=30)
        return True

    def unpin(self, t):
        self.unpins.append(t.data_ptr())
        self.mm.TOTAL_PINNED_MEMORY -= t.nbytes
        return True


_INPUTS = []


def _forward(dm, device):
    if not _INPUTS:
        _INPUTS.extend(inputs()[:3])  # the same inputs for every forward
    x, ctx, sigma = _INPUTS
    with torch.no_grad():
        return dm(x.to(device), sigma.to(device), context=ctx.to(device)).float().cpu()


def _case(fake, mm, pin_ahead, device, mode="plain"):
    """Load, pin ahead, then the first load to ``device``; what happened. ``mode``: "changed" (a weight moves to
    other host memory before the load), "halted" (the load comes while a pin is under way), "declined" (the load
    keeps no host copies), "released" (a sampling run that does not load the MODEL comes first)."""
    from comfyui_ideogram4_int8.ideogram4 import host_pages
    from comfyui_ideogram4_int8.kernels import model_notes
    from comfyui_ideogram4_int8.nodes.runtime import host_copies

    cond, _, _ = load("i4_w8a8.safetensors")
    bm, dm = cond.model, cond.model.diffusion_model
    bm.ideogram4_upload_any_device = not GPU
    original = {k: _bytes(v) for k, v in _weights(dm).items()}
    unpins_before = len(fake.unpins)
    fake.in_pin.clear()
    fake.release.clear()
    # on a GPU the loader queued it already (a second start is refused)
    started = pin_ahead.start(cond, any_device=not GPU) or (GPU and hasattr(bm, "ideogram4_pinned_ahead"))
    pinned_ahead = getattr(bm, "ideogram4_pinned_ahead", [])  # the list the worker fills
    out = {"started": started}

    first_load = functools.partial(cond.patch_model, device_to=device, lowvram_model_memory=0)

    if mode == "halted":
        out["pin_reached"] = fake.in_pin.wait(timeout=30)
        loading = threading.Thread(target=first_load)
        loading.start()
        loading.join(timeout=0.5)
        out["load_waited_for_the_pin"] = loading.is_alive()
        fake.release.set()
        loading.join()
    else:
        pin_ahead.wait()
    entries = list(pinned_ahead)
    maps = host_pages.FileMappings()
    out.update(
        {
            "entries": len(entries),
            "summary": getattr(bm, "ideogram4_pin_ahead_summary", ""),
            "copies_mapped": [maps.holds(e.pinning) for e in entries],
            "copies_equal": [torch.equal(_bytes(e.pinning), original[_name(e.key)]) for e in entries],
            "in_pinned_list": all(any(t is e.pinning for t in bm.ideogram4_pinned) for e in entries),
            "really_pinned": [e.pinning.is_pinned() for e in entries] if GPU else None,
        }
    )
    changed = None
    if mode == "changed" and entries:
        e = entries[0]
        w = e.module._parameters[e.name]
        fresh = _data(w).clone()  # the weight moved to other host memory since it was pinned
        e.module._parameters[e.name] = torch.nn.Parameter(
            QuantizedTensor(fresh, w._layout_cls, w._params) if isinstance(w, QuantizedTensor) else fresh,
            requires_grad=False,
        )
        changed = e
    if mode == "released":
        with pin_ahead.during_run():  # a run of the pack's sampler that loads other MODELs
            pass
        out["released_unpinned"] = sorted(fake.unpins[unpins_before:]) == sorted(e.pinning.data_ptr() for e in entries)
        out["released_list_empty"] = not any(any(t is e.pinning for e in entries) for t in bm.ideogram4_pinned)
    if mode == "declined":
        real_remember = host_copies.remember
        host_copies.remember = lambda *a, **k: 0  # host memory short: the load keeps no host copy
        try:
            first_load()
        finally:
            host_copies.remember = real_remember
    elif mode != "halted":
        first_load()
    not_taken = {id(changed)} if changed is not None else set()
    if mode in ("declined", "released"):
        not_taken = {id(e) for e in entries}
    taken = [e for e in entries if id(e) not in not_taken]
    kept = getattr(bm, "ideogram4_host_copies", {})
    weights_now = {k: _data(v).data_ptr() for k, v in _weights(dm).items()}
    out.update(
        {
            "left_after_load": list(getattr(bm, "ideogram4_pinned_ahead", [])),
            "kept_are_copies": [_data(kept[e.key]).data_ptr() == e.pinning.data_ptr() for e in taken],
            "untaken_unpinned": all(
                any(t is e.pinning for t in bm.ideogram4_pinned) is False
                and e.pinning.data_ptr() in fake.unpins[unpins_before:]
                for e in entries
                if id(e) in not_taken
            ),
            "untaken_not_weights": all(
                e.pinning.data_ptr() not in weights_now.values() for e in entries if id(e) in not_taken
            ),
            "weights_equal": all(torch.equal(_bytes(v), original[k]) for k, v in _weights(dm).items()),
            "note": model_notes.notes("conditional").get(pin_ahead.NOTE_KIND, ""),
            "output": _forward(dm, device),
        }
    )
    cond.unpatch_model(torch.device("cpu"))
    pinned_ptrs = [e.pinning.data_ptr() for e in taken]
    del cond, bm, dm, entries, taken, changed, kept, pinned_ahead, first_load
    gc.collect()
    out["unpinned_when_collected"] = all(p in fake.unpins[unpins_before:] for p in pinned_ptrs) if not GPU else None
    return out


def check_pin_ahead():
    import comfy.model_management as mm
    from comfyui_ideogram4_int8.nodes.runtime import pin_ahead

    write_all()
    device = torch.device("cuda") if GPU else torch.device("cpu")
    fake = _FakePins(mm)
    real = (mm.pin_memory, mm.unpin_memory, mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY, pin_ahead.MIN_BYTES)
    out = {}
    try:
        pin_ahead.MIN_BYTES = 0  # the tiny model's weights are all small
        if not GPU:
            mm.pin_memory, mm.unpin_memory = fake.pin, fake.unpin
            mm.MAX_PINNED_MEMORY = 2**40
        with experiments("pin-ahead=off"):
            cond, _, _ = load("i4_w8a8.safetensors")
            out["off_started"] = pin_ahead.start(cond, any_device=not GPU)
            cond.model.ideogram4_upload_any_device = not GPU
            cond.patch_model(device_to=device, lowvram_model_memory=0)
            out["want"] = _forward(cond.model.diffusion_model, device)
            cond.unpatch_model(torch.device("cpu"))
            del cond
        out["all"] = _case(fake, mm, pin_ahead, device)
        out["all"]["threads"] = sorted(fake.threads)
        out["all"]["pins_under_lock"] = all(fake.locked)
        out["all"]["same_output"] = torch.equal(out["all"].pop("output"), out["want"])
        if not GPU:
            for mode in ("changed", "halted", "declined", "released"):
                if mode == "halted":
                    fake.pins.clear()
                    fake.hold_at = 2
                out[mode] = _case(fake, mm, pin_ahead, device, mode)
                out[mode]["same_output"] = torch.equal(out[mode].pop("output"), out["want"])
                fake.hold_at = None
            # ComfyUI's budget less the reserve holds one weight's bytes and a half: one pin, then it stops
            dm = load("i4_w8a8.safetensors")[0].model.diffusion_model
            first = max(_data(v).nbytes for v in _weights(dm).values())
            del dm
            mm.TOTAL_PINNED_MEMORY = 0
            mm.MAX_PINNED_MEMORY = pin_ahead.RESERVE + first + first // 2
            out["budget"] = _case(fake, mm, pin_ahead, device)
            out["budget"]["same_output"] = torch.equal(out["budget"].pop("output"), out["want"])
            out["budget"]["total_after"] = mm.TOTAL_PINNED_MEMORY
            import comfy.memory_management as cmm

            mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY, headroom = 2**40, 0, cmm.RAM_CACHE_HEADROOM
            cmm.RAM_CACHE_HEADROOM = 2**30  # ComfyUI's RAM cache on: pins from another thread could evict it
            try:
                out["ram_cache"] = _case(fake, mm, pin_ahead, device)
                out["ram_cache"]["same_output"] = torch.equal(out["ram_cache"].pop("output"), out["want"])
            finally:
                cmm.RAM_CACHE_HEADROOM = headroom
            mm.MAX_PINNED_MEMORY = 0
            cond, _, _ = load("i4_w8a8.safetensors")
            out["pinning_off_started"] = pin_ahead.start(cond, any_device=True)
    finally:
        mm.pin_memory, mm.unpin_memory, mm.MAX_PINNED_MEMORY, mm.TOTAL_PINNED_MEMORY, pin_ahead.MIN_BYTES = real
    out.pop("want")
    return out
