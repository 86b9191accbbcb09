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
# On a CPU the passes over a chunk are bound by memory: a chunk that stays in the caches between them is several
# times faster than one of 256 MiB, and a much smaller one pays per-op overhead (docs/design/measurements.md)
CPU_CHUNK_BYTES = 1 << 22


class NonFiniteWeightError(ValueError):
    """A weight to convert holds NaN or Inf (the caller names the file and key)."""


def rows_per_chunk(k: int, device: torch.device, max_chunk_bytes: int) -> int:
    """Rows of K float32 values per chunk: at most ``max_chunk_bytes``, and on a CPU at most ``CPU_CHUNK_BYTES``."""
    if device.type == "cpu":
        max_chunk_bytes = min(max_chunk_bytes, CPU_CHUNK_BYTES)
    return max(1, max_chunk_bytes // max(1, 4 * k))


class _Rows:
    """A weight read a row chunk at a time as float32 (times its scale), into buffers allocated once.

    CPU loads are bound by the float32 temporaries, not the arithmetic: a fresh 200 MB tensor per op costs more in
    page faults than the op, so the buffers are allocated once and, on a CPU, sized to stay in the caches
    (``CPU_CHUNK_BYTES``). torch converts float8 to float32 one element at a time on the CPU (slow: the numbers are in
    docs/design/measurements.md), so the CPU path goes
    through int16 bit operations into float16 (exact), then float32: an e5m2 code is a float16's top byte; an e4m3
    code with its sign bit off, moved up 7 bits, is the bit pattern of a float16 equal to the code's value / 256, its
    subnormals included. e4m3fn's NaN codes (S.1111.111) have no float16 counterpart there: they are found on the
    way and refused.
    Every value equals ``weight[rows].float() * scale`` bit for bit (the twin's arithmetic, in place)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor | None, max_chunk_bytes: int):
        n, k = weight.shape
        self.weight, self.n, self.step = weight, n, max(1, min(n, rows_per_chunk(k, weight.device, max_chunk_bytes)))
        self.scale = None if scale is None else scale.float().to(weight.device)
        self.buf = torch.empty((self.step, k), dtype=torch.float32, device=weight.device)
        self.by_bits = weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and weight.device.type == "cpu"
        if self.by_bits:
            self.bits = torch.empty((self.step, k), dtype=torch.int16)
            self.sign = torch.empty((self.step, k), dtype=torch.int16)

    def chunks(self):
        """(start, stop, float32 rows) per chunk; the rows are overwritten by the next chunk."""
        for start in range(0, self.n, self.step):
            stop = min(self.n, start + self.step)
            yield start, stop, self.read(start, stop)

    def read(self, start: int, stop: int) -> torch.Tensor:
        out = self.buf[: stop - start]
        if self.by_bits:
            self._fp8_to_float(self.weight[start:stop], out)
        else:
            out.copy_(self.weight[start:stop])
        if self.scale is not None:
            out.mul_(self.scale.reshape(()) if self.scale.numel() == 1 else self.scale.reshape(-1, 1)[start:stop])
        return out

    def _fp8_to_float(self, codes: torch.Tensor, out: torch.Tensor) -> None:
        if codes.numel() == 0:
            return
        bits = self.bits[: codes.shape[0]]
        bits.copy_(codes.view(torch.int8))  # sign-extended: bit 15 set for a negative code
        if codes.dtype == torch.float8_e5m2:  # e5m2 is float16's top byte (its Inf and NaN too)
            out.copy_(bits.mul_(256).view(torch.float16))
            return
        sign = self.sign[: codes.shape[0]]
        torch.bitwise_and(bits, -0x8000, out=sign)
        bits.bitwise_and_(0x7F)
        if int(bits.amax()) == 0x7F:  # the largest magnitude code is NaN's (a reduction: eq + any would write a mask)
            raise NonFiniteWeightError("the weight holds NaN values")
        bits.mul_(128).bitwise_or_(sign)  # exponent and mantissa 7 bits up: the float16 of value / 256
        out.copy_(bits.view(torch.float16)).mul_(256.0)


def row_absmax(rows: torch.Tensor) -> torch.Tensor:
    # amax and amin apart: one pass each, vectorized (abs() would write a temporary, aminmax is slower on a CPU:
    # docs/performance.md, "CPU");
    # abs_: maximum(0.0, -0.0) may be -0.0 where abs().amax() is +0.0 (a zero row's scale keeps its sign bit)
    return torch.maximum(rows.amax(dim=1), rows.amin(dim=1).neg_()).abs_()


def _absmax(rows: torch.Tensor) -> torch.Tensor:
    if rows.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=rows.device)
    return torch.maximum(rows.amax(), rows.amin().neg()).abs_()


def _check_finite(t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteWeightError("the weight holds NaN or Inf values")


def quantize_weight(
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    smooth: torch.Tensor | None = None,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """W = weight * scale (scale: None, scalar or per row) -> (int8 [N, K], float32 [N]).

    ``weight`` may be float32/bf16/fp16/fp8; the result equals
    ``kernels.quantize_weight_ref(weight.float() * scale, smooth)`` bit for bit (the same operations, in place on
    a reused buffer). Raises NonFiniteWeightError when W holds NaN/Inf (the caller names the key).
    """
    n, k = weight.shape
    rows = _Rows(weight, scale, max_chunk_bytes)
    smooth = None if smooth is None else smooth.float().to(weight.device)[None, :]
    q = torch.empty((n, k), dtype=torch.int8, device=weight.device)
    s = torch.empty((n,), dtype=torch.float32, device=weight.device)
    for start, stop, wf in rows.chunks():
        if smooth is not None:
            wf.mul_(smooth)
        amax = row_absmax(wf)
        _check_finite(amax)
        qmax = torch.full_like(amax, kernels.reference.QMAX)
        inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
        q[start:stop].copy_(wf.mul_(inv[:, None]).round_().clamp_(-kernels.reference.QMAX, kernels.reference.QMAX))
        s[start:stop] = amax / qmax
    return q, s


def quantize_fp8_tensorwise(
    weight: torch.Tensor, scale: torch.Tensor | None = None, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """W = weight * scale -> (float8_e4m3fn [N, K], float32 []) with W ~= codes * s, s = absmax(W) / 448 (ComfyUI's
    ``float8_e4m3fn`` form: one scale per tensor). An e4m3 weight with one scale is returned as it is (the file's own
    codes). An all-zero W gets s = 1. Raises NonFiniteWeightError when W holds NaN/Inf (the caller names the key)."""
    if weight.dtype == torch.float8_e4m3fn and (scale is None or scale.numel() == 1):
        s = torch.ones((), dtype=torch.float32) if scale is None else scale.float().reshape(())
        return weight.contiguous(), s.to(weight.device)
    n, k = weight.shape
    rows = _Rows(weight, scale, max_chunk_bytes)
    amax = torch.zeros((), dtype=torch.float32, device=weight.device)
    for _, _, wf in rows.chunks():
        amax = torch.maximum(amax, _absmax(wf))
    _check_finite(amax)
    s = amax / FP8_MAX if bool(amax > 0) else torch.ones((), dtype=torch.float32, device=weight.device)
    q = torch.empty((n, k), dtype=torch.float8_e4m3fn, device=weight.device)
    for start, stop, wf in rows.chunks():
        q[start:stop].copy_(wf.div_(s))
    return q, s


def dequantize_fp8(
    weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> torch.Tensor:
    """fp8 weight * scale -> ``dtype`` (for fp8 layers that stay float). Raises NonFiniteWeightError for NaN/Inf, as
    the conversions to int8 and e4m3 do (on every device and fp8 format)."""
    n, k = weight.shape
    out = torch.empty((n, k), dtype=dtype, device=weight.device)
    for start, stop, wf in _Rows(weight, scale, max_chunk_bytes).chunks():
        _check_finite(_absmax(wf))
        out[start:stop].copy_(wf)
    return out
