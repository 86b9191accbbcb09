"""What a kernel path does once per shape, refused inside a CUDA graph capture.

Autotuning a GEMM shape and measuring the attention at a shape time kernels and wait for them: inside a capture
that would break the capture, or be recorded into the graph. ``refuse_first_use`` raises ``FirstUseInCapture``
there instead, before anything is launched, so the capture fails and its caller (``ideogram4/graph_replay.py``)
runs the pass eagerly, where the work is done once and kept. A kernel launch that fails inside a capture is the
capture's failure, not the kernel's: ``capturing`` lets the paths that demote a failing kernel tell the two apart.
"""

from __future__ import annotations

import torch


class FirstUseInCapture(RuntimeError):
    """One-time work for a shape met inside a CUDA graph capture: the pass must run eagerly first."""


def capturing(device: torch.device) -> bool:
    """Whether the current stream of CUDA ``device``'s thread is capturing a graph (False off CUDA, and where this
    torch has no CUDA: nothing can capture there)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def refuse_first_use(device: torch.device, what: str) -> None:
    """Raise ``FirstUseInCapture`` naming ``what`` while a graph is captured on ``device``; nothing otherwise."""
    if capturing(device):
        raise FirstUseInCapture(f"{what} at its first use, inside a CUDA graph capture: the pass runs eagerly first")


__all__ = ["FirstUseInCapture", "capturing", "refuse_first_use"]
