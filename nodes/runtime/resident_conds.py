"""The text context put on the sampling device once per run, not copied there in every model call.

ComfyUI keeps a CONDITIONING's tensors where the text encoder left them (the CPU, pageable memory), and its model
base casts the context to the GPU in every call (``BaseModel._apply_model`` → ``cast_to_device``). For Ideogram 4
that is 512 × 53248 features per conditional pass: a 54.5 MB pageable copy on the compute stream, milliseconds of
every step (docs/design/measurements.md), under ComfyUI's own samplers and guiders.

``BaseModel.extra_conds`` runs once per sampling run (``samplers.encode_model_conds``) and is told the sampling
device: wrapped here on the pack's models, the context it returns is already there in the model's inference dtype,
so the per-call cast finds nothing to do. It lives as long as the encoded conds do: ComfyUI drops them after a run,
but a guider whose run was interrupted (CFGGuider deletes them only after a clean run) or ComfyUI's dual-model
guider's negative conds keep theirs, and so this copy (54.5 MB at 512 tokens), until that guider runs again.
The pack's sampler node moves its CONDITIONING to the device once per run for any MODEL (``sampler_nodes``); this
covers the pack's MODELs under every other sampler.
"""

from __future__ import annotations

import torch

from ...kernels import settings

EXPERIMENT = "no-resident-conds"  # ComfyUI's per-call cast (A/B measurements)
CONTEXT_KEY = "c_crossattn"  # what _apply_model casts to (device, inference dtype) on every call


def install(model) -> None:
    """Wrap ``model.extra_conds`` (a ComfyUI BaseModel) so its context comes back on the sampling device, in the dtype
    ``_apply_model`` would cast it to. Idempotent."""
    inner = model.extra_conds
    if getattr(inner, "ideogram4_resident", False):
        return

    def extra_conds(**kwargs):
        out = inner(**kwargs)
        if settings.flag(EXPERIMENT):
            return out
        cond = out.get(CONTEXT_KEY)
        device = kwargs.get("device")
        if device is not None and hasattr(cond, "_copy_with"):  # CONDRegular: process_cond copies it the same way
            out[CONTEXT_KEY] = cond._copy_with(resident(cond.cond, torch.device(device), model.get_dtype_inference()))
        return out

    extra_conds.ideogram4_resident = True
    model.extra_conds = extra_conds


def resident(context: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``context`` on ``device`` in ``dtype``, as the per-call cast would make it; on a CPU device it stays as is
    (nothing crosses a bus there, and the cast is the model call's to make)."""
    if device.type == "cpu" or not torch.is_tensor(context) or not context.is_floating_point():
        return context
    if device.index is None and device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())  # the per-call cast compares indexed devices
    return context.to(device=device, dtype=dtype)
