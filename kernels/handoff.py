"""A producer kernel's quantized output, handed to the activation quantizer of the linear it feeds.

A block's pre-norm (``dispatch.rms_norm_modulate(..., hand_off=True)``) writes its bf16 output and, in the same pass,
that output's per-token int8 form (``rms_modulate_triton.py``, ``QUANT``). It ``offer``s the pair here. The next
quantization of exactly that tensor with nothing to divide or rotate (``dispatch._quantize_rows``) ``claim``s it
instead of reading the row again: the values are the ones the quantizer would compute, bit for bit.

Exactly that tensor: the same storage, offset, shape, strides and dtype, and no write since the offer (its version
counter).
The slot holds the output itself, so its memory cannot be reused by another tensor while offered. One slot per
thread (two cards run their branches in two threads); a claim empties it, and so does ``clear``, which the producer's
caller runs once the consumer is done, so an unclaimed offer never outlives its block.

Inference tensors have no version counter, and ComfyUI runs its nodes under ``torch.inference_mode``. For them the
guarantee is the caller's: the block offers only where nothing can write the output before the consuming linear reads
it (ComfyUI's or the pack's attention / FFN class, whose first op is that linear, and no foreign forward pre-hook:
``nodes/runtime/block_norms.py``) and clears right after the consumer.
"""

from __future__ import annotations

import threading

import torch

_SLOT = threading.local()


def offer(out: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """``q`` int8 [R, C] and ``scale`` float32 [R] are the per-token quantization of ``out`` viewed as [R, C]."""
    _SLOT.entry = (out, None if out.is_inference() else out._version, q, scale)


def claim(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q, scale) when ``x2`` [R, C] is the offered output as it was offered (then the slot empties), else None."""
    entry = getattr(_SLOT, "entry", None)
    if entry is None:
        return None
    out, version, q, scale = entry
    if (
        x2.data_ptr() != out.data_ptr()
        or x2.device != out.device
        or x2.dtype != out.dtype
        or x2.shape != q.shape
        or x2.stride() != q.stride()
        or (version is not None and x2._version != version)
    ):
        return None
    _SLOT.entry = None
    return q, scale


def clear() -> None:
    """Drop an unclaimed offer (its tensors are freed with it)."""
    _SLOT.entry = None


def pending() -> bool:
    """Whether this thread holds an unclaimed offer (tests)."""
    return getattr(_SLOT, "entry", None) is not None
