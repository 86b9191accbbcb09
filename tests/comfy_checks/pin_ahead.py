"""Host weights pinned ahead of a MODEL's first load (``nodes/runtime/pin_ahead.py``). On a CPU nothing pins:
ComfyUI's pin book is faked (each pin recorded and counted in its total) and the CPU stands in for the card; on a GPU
(COMFY_GPU=1) the pins are real and the first load's upload is only queued."""

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
    """ComfyUI's pin_memory / unpin_memory on a CPU: recorded, counted in its total, ``ok`` or refused; ``hold``:
    the n-th pin stops the worker while it is under way (as a load to the card would)."""

    def __init__(self, mm, pin_ahead):
        self.mm, self.pin_ahead = mm, pin_ahead
        self.pins, self.unpins, self.threads, self.locked = [], [], set(), []
        self.stop_at = None

    def pin(self, t):
        from comfyui_ideogram4_int8.nodes.runtime import stream_pins

        self.pins.append(t.data_ptr())
        self.threads.add(threading.current_thread().name)
        self.locked.append(stream_pins.BOOKKEEPING._is_owned())
        self.mm.TOTAL_PINNED_MEMORY += t.nbytes
        if self.stop_at is not None and len(self.pins) == self.stop_at:
            self.pin_ahead._WORKER._stop.set()
        return True

    def unpin(self, t):
        self.unpins.append(t.data_ptr())
        return True


_INPUTS = []


def _forward(dm, device):
    if not _INPUTS:
        _INPUTS.extend(inputs()[:3])  # the same inputs for every forward
    x, ctx, sigma = _INPUTS
    with torch.no_grad():
        return dm(x.to(device), sigma.to(device), context=ctx.to(device)).float().cpu()


def _case(fake, mm, pin_ahead, device, change_one=False):
    """Load, pin ahead, (change one weight), load to ``device``; what happened."""
    from comfyui_ideogram4_int8.ideogram4 import host_pages
    from comfyui_ideogram4_int8.kernels import model_notes

    cond, _, _ = load("i4_w8a8.safetensors")
    bm, dm = cond.model, cond.model.diffusion_model
    bm.ideogram4_upload_any_device = not GPU
    original = {k: _bytes(v) for k, v in _weights(dm).items()}
    # on a GPU the loader queued it already (a second start is refused)
    started = pin_ahead.start(cond, any_device=not GPU) or (GPU and hasattr(bm, "ideogram4_pinned_ahead"))
    pin_ahead.wait()
    entries = list(getattr(bm, "ideogram4_pinned_ahead", []))
    maps = host_pages.FileMappings()
    out = {
        "started": started,
        "entries": len(entries),
        "summary": getattr(bm, "ideogram4_pin_ahead_summary", ""),
        "copies_mapped": [maps.holds(e.pinning) for e in entries],
        "copies_equal": [torch.equal(_bytes(e.pinning), original[_name(e.key)]) for e in entries],
        "in_pinned_list": all(any(t is e.pinning for t in bm.ideogram4_pinned) for e in entries),
        "really_pinned": [e.pinning.is_pinned() for e in entries] if GPU else None,
    }
    changed = None
    if change_one and entries:
        e = entries[0]
        w = e.module._parameters[e.name]
        fresh = _data(w).clone()  # the weight moved to other host memory since it was pinned
        e.module._parameters[e.name] = torch.nn.Parameter(
            QuantizedTensor(fresh, w._layout_cls, w._params) if isinstance(w, QuantizedTensor) else fresh,
            requires_grad=False,
        )
        changed = e
    cond.patch_model(device_to=device, lowvram_model_memory=0)
    taken = [e for e in entries if e is not changed]
    kept = bm.ideogram4_host_copies
    out.update(
        {
            "left_after_load": getattr(bm, "ideogram4_pinned_ahead", None),
            "kept_are_copies": [_data(kept[e.key]).data_ptr() == e.pinning.data_ptr() for e in taken],
            "weights_equal": all(torch.equal(_bytes(v), original[k]) for k, v in _weights(dm).items()),
            "changed_unpinned": None if changed is None else changed.pinning.data_ptr() in fake.unpins,
            "changed_left_pinned_list": None
            if changed is None
            else not any(t is changed.pinning for t in bm.ideogram4_pinned),
            "note": model_notes.notes("conditional").get(pin_ahead.NOTE_KIND, ""),
            "output": _forward(dm, device),
        }
    )
    cond.unpatch_model(torch.device("cpu"))
    pinned_ptrs = [e.pinning.data_ptr() for e in entries]
    del cond, bm, dm, entries, taken, changed, kept
    gc.collect()
    out["unpinned_when_collected"] = all(p in fake.unpins for p in pinned_ptrs) if not GPU else None
    return out


def check_pin_ahead():
    import comfy.model_management as mm
    from comfyui_ideogram4_int8.nodes.runtime import pin_ahead

    write_all()
    device = torch.device("cuda") if GPU else torch.device("cpu")
    fake = _FakePins(mm, pin_ahead)
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
            out["changed"] = _case(fake, mm, pin_ahead, device, change_one=True)
            out["changed"]["same_output"] = torch.equal(out["changed"].pop("output"), out["want"])
            fake.pins.clear()
            fake.stop_at = 2
            out["halted"] = _case(fake, mm, pin_ahead, device)
            out["halted"]["same_output"] = torch.equal(out["halted"].pop("output"), out["want"])
            fake.stop_at = None
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
