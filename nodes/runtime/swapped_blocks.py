"""What the pack's swapped ComfyUI modules share (``qk_rope.FusedRopeAttention``, ``block_norms.FusedNormBlock``):
the class swap itself, when ComfyUI's own code runs instead, and the model note that says which ran (the pack's
kernel, its twin and why, or ComfyUI's own and why)."""

from __future__ import annotations

import comfy.model_management
import torch

from ...kernels import model_notes, settings
from ...kernels.backends import unavailable


def comfyui_reason(experiment: str, own: str) -> str | None:
    """Why ComfyUI's own ``own`` runs instead of the pack's kernel: the experiment ``experiment``=comfyui (A/B
    measurements), or training."""
    if settings.experiment(experiment) == "comfyui":
        return f"{settings.said(experiment)}: {own}"
    if comfy.model_management.in_training:
        return f"training: {own}"
    return None


def swap_class(diffusion_model: torch.nn.Module, original: type, replacement: type, label: str | None) -> int:
    """Make every module of exactly ``original``'s class a ``replacement`` labelled ``label``; returns how many."""
    n = 0
    for m in diffusion_model.modules():
        if type(m) is original:
            m.__class__ = replacement
            m.site_label = label
            n += 1
    return n


def write_note(
    label: str | None, kind: str, topic: str, why: str | None, device, fused: str, twin: str, demoted: str | None = None
) -> None:
    """The model's ``kind`` note, written when it changes: ``fused`` when the pack's kernel can run on ``device``,
    ``twin`` with the reason when only its twin can (no Triton there, or the kernel ``demoted`` after a failure),
    "``topic``: ``why``" when ComfyUI's own runs."""
    if label is None:
        return
    if why is not None:
        note = f"{topic}: {why}"
    else:  # the availability question the kernels ask before they launch
        missing = unavailable("triton", device) or demoted
        note = fused if missing is None else f"{twin}: {missing}"
    model_notes.set_note(label, kind, note)
