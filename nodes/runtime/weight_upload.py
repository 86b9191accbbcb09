"""A pack MODEL's weights go to the card in one staged bulk copy (``ideogram4.upload``) before ComfyUI's load moves
them module by module.

ComfyUI's legacy ``ModelPatcher.load`` moves a model with one ``.to(device)`` per module; from pageable host memory
each copy is synchronous, so the host copy and the bus take turns. The pack's patcher calls ``before_load`` just
before ComfyUI's load with what that load is about to put on the card unchanged:

* a full load: the whole model; a load that keeps everything it loads resident (a budget that covers the model, or
  the resident part of a streamed plan): the modules of the patcher's ``_load_list``, which leaves out the streamed
  blocks' linears and the image-only branch's host layers (their weights stay pinned on the host);
* never a LoRA-patched module: ComfyUI backs up the original and merges on the card (``patch_weight_to_device``);
* only host tensors (an int8 ``QuantizedTensor`` crosses as its int8 data; its scale follows with ``.to``).

The copies replace the modules' tensors through each module's ``_apply``, the method ``.to`` calls, so ComfyUI's
re-wrapping of quantized weights and torch's Parameter handling run as in a ``.to``; ComfyUI's load then finds them
on the card (its ``.to`` copies nothing) and keeps its bookkeeping as usual. A weight ComfyUI pinned when it
offloaded it is copied straight from pinned memory and then unpinned, as ComfyUI's own load unpins it, so nothing
stays pinned and no second copy stays on the card; ``partially_unload`` and ``unpatch_model`` move the weights back
module by module as before.

The experiment ``upload=comfyui`` keeps ComfyUI's own move (A/B). ``upload=overlap`` (to measure) lets the copies
run beside what comes next: the host does not wait for them (``upload.to_device``'s ``wait``) and the moved modules
are marked as ComfyUI marks a module it loaded (``comfy_patched_weights``), so its load neither patches them again
nor synchronizes the device after each. The panel's model note ``upload`` says how the
weights went up.
"""

from __future__ import annotations

import logging

import torch
from comfy.quant_ops import QuantizedTensor

from ...ideogram4 import upload
from ...kernels import model_notes, settings
from . import host_copies, stream_pins
from .int8_ops import site_label

log = logging.getLogger("comfyui_ideogram4_int8")

EXPERIMENT = "upload"  # upload=comfyui: ComfyUI's module-by-module move (A/B measurements)
OVERLAP = "overlap"  # upload=overlap: the host does not wait for the copies, ComfyUI's load skips the moved modules
NOTE_KIND = "upload"


def enabled() -> bool:
    return settings.experiment(EXPERIMENT) != "comfyui"


def _modules(patcher, whole_model: bool) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every module ComfyUI's load is about to move: the model, or ``_load_list``'s modules with
    their submodules (``.to`` on a module moves its children's buffers too)."""
    if whole_model:
        return list(patcher.model.named_modules())
    found: dict[int, tuple[str, torch.nn.Module]] = {}
    for entry in patcher._load_list():
        name, module = entry[-3], entry[-2]
        for sub_name, sub in module.named_modules(prefix=name):
            found.setdefault(id(sub), (sub_name, sub))
    return list(found.values())


def _plan(patcher, whole_model: bool) -> tuple[list[tuple[str, torch.Tensor, torch.Tensor]], list[torch.nn.Module]]:
    """(tensors, owners): (key, tensor, host data) of each host tensor to move, once each, and every module holding
    one; the modules are those ComfyUI's load moves, less the LoRA-patched ones."""
    items, owners, seen = [], {}, set()
    for name, m in _modules(patcher, whole_model):
        if any(f"{name}.{p}" in patcher.patches for p in m._parameters):
            continue
        for pname, t in (*m._parameters.items(), *m._buffers.items()):
            data = t._qdata if isinstance(t, QuantizedTensor) else t
            if t is None or data.device.type != "cpu":
                continue
            owners[id(m)] = m  # a tensor shared by two modules: each module's _apply takes the copy
            if id(t) not in seen:
                seen.add(id(t))
                items.append((f"{name}.{pname}" if name else pname, t, data))
    return items, list(owners.values())


def planned(patcher, whole_model: bool) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(key, tensor, host data) of every tensor ``before_load`` moves (see ``_plan``)."""
    return _plan(patcher, whole_model)[0]


def before_load(patcher, device, whole_model: bool) -> upload.UploadReport | None:
    """Put on ``device`` what ComfyUI's load is about to move there unchanged (module docstring); the report, or
    None when nothing moved here. ``whole_model``: a full load (ComfyUI then moves the whole model)."""
    if device is None:
        return None
    if not enabled():
        _publish(patcher, None)
        return None
    device = torch.device(device)
    host_twin = device.type == "cpu" and getattr(patcher.model, "ideogram4_upload_any_device", False)  # tests
    if device.type != "cuda" and not host_twin:
        return None
    items, owners = _plan(patcher, whole_model)
    if not items:
        return None
    kept = host_copies.remember(patcher, items)  # an unload then drops the card copies (host_copies)
    overlap = settings.experiment(EXPERIMENT) == OVERLAP
    # ComfyUI's own pins are dropped right after: the host waits for copies out of them
    wait = not overlap or any(key in getattr(patcher, "pinned", ()) for key, *_ in items)
    moved, report = upload.to_device([data for *_, data in items], device, host_twin=host_twin, wait=wait)
    with stream_pins.BOOKKEEPING:  # in turn with the pack's other calls into ComfyUI's pin book
        for key, *_ in items:
            patcher.unpin_weight(key)  # a weight ComfyUI pinned when it offloaded it (a no-op for the others)
    table = {id(t): (t, new) for (_, t, _), new in zip(items, moved, strict=True)}

    def swap(t):
        entry = table.get(id(t))
        if entry is None or entry[0] is not t:
            return t
        new = entry[1]
        if isinstance(t, QuantizedTensor):
            return QuantizedTensor(new, t._layout_cls, t._params.to_device(device))
        return new

    with torch.no_grad():
        for m in owners:
            m._apply(swap, recurse=False)
            if overlap:  # no patch applies to it: ComfyUI's load then skips it, and its synchronize after it
                m.comfy_patched_weights = True
    note = f"weights to the card: {report.describe()}"
    if kept:
        note += f"; their host copies kept ({kept / 2**30:.2f} GiB of RAM): an unload copies nothing back"
    label = _publish(patcher, note)
    log.info("ideogram4-int8: %s %s", label or "model", note)
    return report


def _publish(patcher, note: str | None) -> str | None:
    label = site_label(patcher.model.diffusion_model)
    if label:
        model_notes.set_note(label, NOTE_KIND, note)
    return label


__all__ = ["EXPERIMENT", "NOTE_KIND", "OVERLAP", "before_load", "enabled", "planned"]
