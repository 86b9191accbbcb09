"""Attention for the pack's MODELs: PyTorch SDPA with cuDNN attention first, where it runs.

ComfyUI asks SDPA for FlashAttention-2 first (comfy/ops.py ``SDPA_BACKEND_PRIORITY``). At Ideogram 4's head
dim 256 on Hopper, cuDNN's attention does the same unmasked attention in about half the time
(docs/design/measurements.md). The pack's MODELs therefore carry an
``optimized_attention_override`` (ComfyUI's own extension point in ``transformer_options``) that runs an
unmasked CUDA attention through SDPA with cuDNN first and FlashAttention-2 next; anything else (a mask, the
CPU, other dtypes, a torch without backend priorities) goes to ComfyUI's function unchanged.
``IDEOGRAM4_INT8_ATTENTION=comfyui`` turns the override off. A later node that sets its own override (e.g. a
SageAttention patch on the MODEL) replaces this one.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from ..kernels import settings

KEY = "optimized_attention_override"


def _priority_context():
    """SDPA restricted to cuDNN, then FlashAttention-2, then the rest, in that order; None where this torch
    cannot set a priority (then ComfyUI's attention runs)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    if "set_priority" not in inspect.signature(sdpa_kernel).parameters:
        return None
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return lambda: sdpa_kernel(order, set_priority=True)


_PRIORITY = _priority_context()


def cudnn_first_attention(
    func, q, k, v, heads, mask=None, attn_precision=None, skip_reshape=False, skip_output_reshape=False, **kwargs
):
    """ComfyUI's optimized-attention signature; ``func`` is ComfyUI's own attention function."""
    if (
        _PRIORITY is None
        or mask is not None
        or not skip_reshape
        or not q.is_cuda
        or q.dtype not in (torch.bfloat16, torch.float16)
        or kwargs.get("enable_gqa")
    ):
        return func(
            q,
            k,
            v,
            heads,
            mask=mask,
            attn_precision=attn_precision,
            skip_reshape=skip_reshape,
            skip_output_reshape=skip_output_reshape,
            **kwargs,
        )
    with _PRIORITY():
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)
    if skip_output_reshape:
        return out
    b, h, n, d = out.shape
    return out.transpose(1, 2).reshape(b, n, h * d)


def install(model_options: dict, device: torch.device | None = None) -> str:
    """Put the override into a ModelPatcher's ``model_options`` (unless switched off); what it says for the
    loader's summary about the model's ``device`` (the override serves CUDA only: elsewhere ComfyUI's attention
    runs, and the summary says so)."""
    if settings.attention() == "comfyui":
        return f"attention: ComfyUI's own ({settings.said(settings.ATTENTION)})"
    if _PRIORITY is None:
        return "attention: ComfyUI's own (this torch cannot order SDPA backends)"
    options = model_options.setdefault("transformer_options", {})
    if options.get(KEY, cudnn_first_attention) is not cudnn_first_attention:
        return "attention: the override already set on this MODEL (kept)"
    options[KEY] = cudnn_first_attention
    if device is not None and device.type != "cuda":
        # installed anyway (it passes non-CUDA tensors through), but the summary names what runs on this device
        return f"attention: ComfyUI's own on the {device.type.upper()} (the pack's cuDNN-first SDPA serves CUDA only)"
    return "attention: SDPA with cuDNN first (ComfyUI orders FlashAttention-2 first; on Hopper cuDNN is ~2x faster)"
