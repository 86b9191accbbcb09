"""Attention for the pack's MODELs: the path ``kernels/attention_choice.py`` chose for each shape on the device.

ComfyUI asks SDPA for FlashAttention-2 first; at Ideogram 4's head dim 256 on Hopper cuDNN's attention does the
same unmasked attention in about half the time, and an 8-bit attention (comfy-kitchen's INT8) may be faster still
where cuDNN's is not available (docs/performance.md#attention). The pack's MODELs therefore carry an
``optimized_attention_override`` (ComfyUI's own extension point in ``transformer_options``): a ``PackAttention``
holding the MODEL's registry label, which runs each unmasked CUDA self-attention through the chosen candidate
(measured on the first call of a shape, a dictionary lookup after), counts the calls it served per path, and keeps the
MODEL's ``attention`` note naming the path and why. Anything else (a mask, the CPU, other dtypes, a torch without
SDPA backend priorities) goes to ComfyUI's function unchanged. ``IDEOGRAM4_INT8_ATTENTION=comfyui`` turns the
override off; sdpa | int8 | fp8 force a path where it can run. A later node that sets its own override (e.g. a
SageAttention patch on the MODEL) replaces this one, and an override another node set before is kept.
"""

from __future__ import annotations

import torch

from ...kernels import attention_choice, capture_guard, model_notes, settings
from ...kernels.attention_choice import CANDIDATES, PRIORITY, SDPA, Shape

KEY = "optimized_attention_override"
NOTE_KIND = "attention"
_is_compiling = torch.compiler.is_compiling


def _serves(q, k, v, mask, skip_reshape, kwargs) -> bool:
    """Whether the pack runs this call: unmasked, [B, H, L, D] bf16/fp16 CUDA tensors of one shape, no GQA."""
    return (
        PRIORITY is not None
        and mask is None
        and skip_reshape
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and not kwargs.get("enable_gqa")
        and q.shape == k.shape == v.shape
    )


class PackAttention:
    """ComfyUI's optimized-attention signature (``func`` is ComfyUI's own attention function) for the MODEL
    ``label``. ``runs``: calls served per path, eager ones (a compiled graph or a replayed CUDA graph runs no
    Python)."""

    def __init__(self, label: str | None = None):
        self.label = label
        self.runs = dict.fromkeys(CANDIDATES, 0)
        self._noted: tuple | None = None  # (choice, shape) of the note last written

    def __call__(
        self, func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kw
    ):
        if not _serves(q, k, v, mask, skip_reshape, kw):
            return func(
                q,
                k,
                v,
                heads,
                mask=mask,
                attn_precision=attn_precision,
                skip_reshape=skip_reshape,
                skip_output_reshape=skip_output_reshape,
                **kw,
            )
        b, h, n, d = q.shape
        if _is_compiling():  # traced: the answer an eager call gave (a lookup), else SDPA; nothing measured
            choice = attention_choice.lookup(q.device, n, h, d, q.dtype)
            out = CANDIDATES[SDPA if choice is None else choice.path].run(q, k, v)
        else:
            out = self._run(q, k, v, Shape(n, h, d))
        if skip_output_reshape:
            return out
        return out.transpose(1, 2).reshape(b, n, h * d)

    def _run(self, q, k, v, shape: Shape) -> torch.Tensor:
        choice = attention_choice.choose(q.device, shape, q.dtype)
        path = choice.path
        try:
            out = CANDIDATES[path].run(q, k, v)
        except Exception as exc:
            if path == SDPA or capture_guard.capturing(q.device):
                raise  # inside a capture: the capture's failure (its eager retry runs the path), not the path's
            choice = attention_choice.give_way(q.device, shape, q.dtype, path, exc)
            path = SDPA
            out = CANDIDATES[SDPA].run(q, k, v)
        self.runs[path] += 1
        if self.label is not None and (choice, shape) != self._noted:  # the MODEL's note, written when it changes
            self._noted = (choice, shape)
            model_notes.set_note(self.label, NOTE_KIND, f"attention at {shape}: {choice.describe()}")
        return out


def install(model_options: dict, device: torch.device | None = None, label: str | None = None) -> str:
    """Put a ``PackAttention`` for the MODEL ``label`` into a ModelPatcher's ``model_options`` (unless switched off
    or another node's override is there); what it says for the loader's summary about the model's ``device`` (the
    override serves CUDA only: elsewhere ComfyUI's attention runs, and the summary says so)."""
    if settings.attention() == "comfyui":
        return f"attention: ComfyUI's own ({settings.said(settings.ATTENTION)})"
    if PRIORITY is None:
        return "attention: ComfyUI's own (this torch cannot order SDPA backends)"
    options = model_options.setdefault("transformer_options", {})
    if not isinstance(options.get(KEY, PackAttention()), PackAttention):
        return "attention: the override already set on this MODEL (kept)"
    options[KEY] = PackAttention(label)
    if device is not None and device.type != "cuda":
        # installed anyway (it passes non-CUDA tensors through), but the summary names what runs on this device
        return f"attention: ComfyUI's own on the {device.type.upper()} (the pack's attention serves CUDA only)"
    return f"attention: {attention_choice.plan(device or torch.device('cuda'))}"
