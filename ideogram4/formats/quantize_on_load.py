"""Float / fp8 weights -> W8A8 form (or float8 e4m3 with a per-tensor scale), row chunk by row chunk on the target
device.

Per output channel, symmetric, round half to even (``kernels.quantize_weight_ref``), with the
optional SmoothQuant vector folded into the weight first. Float32 temporaries are bounded by
``max_chunk_bytes`` so a [4608, 53248] fp8 layer never exists twice in float32.
"""

from __future__ import annotations

import torch

from ... import kernels
from ...kernels.reference import FP8_MAX  # e4m3's largest finite value, as the activation quantizer uses it

DEFAULT_CHUNK_BYTES = 1 << 28  # 256 MiB of float32 rows at a time


def _rows_per_chunk(k: int, max_chunk_bytes: int) -> int:
    return max(1, max_chunk_bytes // max(1, 4 * k))


def _scaled_rows(weight, scale, start, stop):
    wf = weight[start:stop].float()
    if scale is not None:
        s = scale.float()
        if s.numel() == 1:
            wf = wf * s.reshape(())
        else:
            wf = wf * s.reshape(-1, 1)[start:stop]
    return wf


def quantize_weight(
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    smooth: torch.Tensor | None = None,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """W = weight * scale (scale: None, scalar or per row) -> (int8 [N, K], float32 [N]).

    ``weight`` may be float32/bf16/fp16/fp8; the result equals
    ``kernels.quantize_weight_ref(weight.float() * scale, smooth)`` bit for bit.
    """
    n, k = weight.shape
    rows = _rows_per_chunk(k, max_chunk_bytes)
    if rows >= n:
        return kernels.quantize_weight_ref(_scaled_rows(weight, scale, 0, n), smooth)
    q = torch.empty((n, k), dtype=torch.int8, device=weight.device)
    s = torch.empty((n,), dtype=torch.float32, device=weight.device)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        q[start:stop], s[start:stop] = kernels.quantize_weight_ref(_scaled_rows(weight, scale, start, stop), smooth)
    return q, s


def quantize_fp8_tensorwise(
    weight: torch.Tensor, scale: torch.Tensor | None = None, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """W = weight * scale -> (float8_e4m3fn [N, K], float32 []) with W ~= codes * s, s = absmax(W) / 448 (ComfyUI's
    ``float8_e4m3fn`` form: one scale per tensor). An e4m3 weight with one scale is returned as it is (the file's own
    codes). An all-zero W gets s = 1. Raises ValueError when W holds NaN/Inf (the caller names the key)."""
    if weight.dtype == torch.float8_e4m3fn and (scale is None or scale.numel() == 1):
        s = torch.ones((), dtype=torch.float32) if scale is None else scale.float().reshape(())
        return weight.contiguous(), s.to(weight.device)
    n, k = weight.shape
    rows = _rows_per_chunk(k, max_chunk_bytes)
    amax = torch.zeros((), dtype=torch.float32, device=weight.device)
    for start in range(0, n, rows):
        amax = torch.maximum(amax, _scaled_rows(weight, scale, start, min(n, start + rows)).abs().amax())
    if not bool(torch.isfinite(amax)):
        raise ValueError("the weight holds NaN or Inf values")
    s = amax / FP8_MAX if bool(amax > 0) else torch.ones((), dtype=torch.float32, device=weight.device)
    q = torch.empty((n, k), dtype=torch.float8_e4m3fn, device=weight.device)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        q[start:stop] = (_scaled_rows(weight, scale, start, stop) / s).to(torch.float8_e4m3fn)
    return q, s


def dequantize_fp8(
    weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> torch.Tensor:
    """fp8 weight * scale -> ``dtype`` (for fp8 layers that stay float)."""
    n, k = weight.shape
    out = torch.empty((n, k), dtype=dtype, device=weight.device)
    rows = _rows_per_chunk(k, max_chunk_bytes)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        out[start:stop] = _scaled_rows(weight, scale, start, stop).to(dtype)
    return out
