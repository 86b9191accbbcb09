"""Operand checks of the W8A8 entry points (dispatch.py, gate_up.py) and of the kernels' launches.

Each entry-point check raises ``KernelInputError`` with a message that names the argument and the fix, or returns
the operand in the form the kernels take (``_vector``: float32 [L]; ``_out_buffer``: the output buffer). The launch
checks (``tma_problem``, ``gluon_operand_problem``, ``cublas_shape_problem``) return why a kernel cannot take a
call's operands, or None; whether a backend runs on this device at all is ``backends.unavailable``'s question.
"""

from __future__ import annotations

import torch

from . import reference
from .configs import split_plan
from .reference import INT32_SAFE_MAX_K


class KernelInputError(ValueError):
    """Bad operands for a W8A8 kernel; the message names the argument and the fix."""


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _check_k(k: int, where: str) -> None:
    if k < 1:
        raise KernelInputError(f"{where}: K must be >= 1")
    if k > INT32_SAFE_MAX_K:
        raise KernelInputError(
            f"{where}: K={k} exceeds {INT32_SAFE_MAX_K}, where an int32 accumulator of int8 products can "
            "overflow; split the layer along K"
        )


def _check_int8_2d(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int8 or t.dim() != 2:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise KernelInputError(f"{name} must be a 2-D int8 tensor; got {got}")
    if t.stride(1) != 1:
        raise KernelInputError(
            f"{name} must be K-contiguous (row-major [rows, K], stride(1) == 1); got strides {t.stride()}. "
            "Keep nn.Linear weights as [N, K] (the layout the int8 tensor-core GEMM reads); transpose a [K, N] "
            "operand once, at load"
        )


def _vector(
    t: torch.Tensor | None, length: int, name: str, device: torch.device, keep_half: bool = False
) -> torch.Tensor | None:
    """Validate a per-channel vector ([L] or [L, 1], any float dtype) and return float32 [L].

    ``keep_half``: a contiguous bf16/fp16 [L] is returned as it is (the fused kernels load the bias
    in its own dtype and widen it exactly in registers: no conversion kernel per call)."""
    if t is None:
        return None
    if type(t) is torch.Tensor and t.dim() == 1 and t.shape[0] == length and t.device == device:
        if (t.dtype is torch.float32 or (keep_half and t.dtype in _HALF_DTYPES)) and t.is_contiguous():
            return t  # the form modules keep: nothing to convert (this runs on every call)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise KernelInputError(f"{name} must be a floating-point tensor of {length} values")
    if t.numel() != length or (t.dim() == 2 and t.shape[1] != 1) or t.dim() > 2:
        raise KernelInputError(f"{name} must have shape [{length}] or [{length}, 1]; got {tuple(t.shape)}")
    if t.device != device:
        raise KernelInputError(f"{name} is on {t.device} but the operands are on {device}")
    t = t.reshape(length)
    if t.dtype != torch.float32:
        t = t.float()
    return t.contiguous()


def _check_operands(q, w, q_scale=None, w_scale=None, where="int8_matmul"):
    _check_int8_2d(q, f"{where}: q")
    _check_int8_2d(w, f"{where}: w")
    if q.shape[1] != w.shape[1]:
        raise KernelInputError(f"{where}: q is [M, K={q.shape[1]}] but w is [N, K={w.shape[1]}]; K must match")
    if q.device != w.device:
        raise KernelInputError(f"{where}: q on {q.device}, w on {w.device}")
    _check_k(q.shape[1], where)
    if w.shape[0] < 1:
        raise KernelInputError(f"{where}: w has N=0 output channels")


def _check_group(group, k: int, where: str) -> int | None:
    if group is None:
        return None
    try:
        reference.hadamard(group)
    except (TypeError, ValueError) as exc:
        raise KernelInputError(f"{where}: convrot_group: {exc}") from None
    if k % int(group):
        raise KernelInputError(f"{where}: K={k} is not a multiple of the ConvRot group size {group}")
    return int(group)


def _out_buffer(out, m, n, dtype, device, where):
    if out is None:
        return torch.empty((m, n), dtype=dtype, device=device)
    if out.shape != (m, n) or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise KernelInputError(
            f"{where}: out must be a contiguous {dtype} tensor of shape [{m}, {n}] on {device}; "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    return out


# -- launch checks: can a kernel take these operands (the device question is backends.unavailable's) -----------


def tma_problem(*tensors) -> str | None:
    """None when TMA descriptors can address every 2-D operand (16-byte aligned bases and row
    strides, unit inner stride), else why not. Asked on every launch: a plain loop."""
    for t in tensors:
        if t.dim() != 2 or t.stride(1) != 1 or t.data_ptr() & 15 or (t.stride(0) * t.element_size()) & 15:
            return f"TMA cannot address a {t.dtype} operand of shape {tuple(t.shape)}, strides {t.stride()}"
    return None


def gluon_operand_problem(cfg, q, w, out, bias=None, up=None) -> str | None:
    """None when the Gluon kernel with config ``cfg`` can take these operands (``up = (w3, s3)``: the gate/up pair),
    else why not (the caller then runs the portable kernel): TMA must address them, and the SwiGLU epilogue takes
    no bias."""
    if up is not None and bias is not None:
        return "the Gluon SwiGLU epilogue takes no bias"
    if q.shape[1] % 16:
        return f"K = {q.shape[1]} is not a multiple of 16 (TMA row alignment of the int8 operands)"
    if split_plan(cfg, q.shape[1])[1] > 1 and w.shape[0] % 4:
        return f"N = {w.shape[0]} is not a multiple of 4 (TMA rows of the int32 split-K workspace)"
    return tma_problem(q, w, out) if up is None else tma_problem(q, w, up[0], out)


def cublas_shape_problem(device: torch.device, n: int, k: int) -> str | None:
    """None when cuBLASLt's int8 GEMM takes an [n, k] weight on ``device``, else why not."""
    if device.type == "cuda" and (k % 8 or n % 8):
        return f"cuBLASLt int8 needs K and N multiples of 8 (got K={k}, N={n})"
    return None
