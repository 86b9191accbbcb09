"""Public W8A8 entry points and GEMM path dispatch.

Paths, fastest first (DESIGN.md §3):
  triton-int8   fused Triton GEMM (int8 tensor cores, dequant + bias in the epilogue)  CUDA sm_80+
  cublas-int8   torch._int_mm (cuBLASLt on CUDA) + epilogue                            CUDA, CPU with fast int8
  dequant-bf16  the 'phantom INT8' path: dequantize, float matmul                      anywhere
On a CPU, cublas-int8 runs only where torch._int_mm measured faster than the dequantized float matmul
(``cpu_gemm``: without VNNI/AMX it is ~40x slower); there the dequantized matmul runs in float32 (or bf16 where that
measured faster). The path is picked per call from the device, dtype and shape; it can be forced with the
``path`` argument (strict: raises if impossible) or the IDEOGRAM4_INT8_GEMM_PATH environment
variable (lenient: falls back, and the registry says so). Every call records its path and the
reason a faster one was not taken in ``registry.REGISTRY``.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import torch.nn.functional as F

from . import cpu_gemm, reference
from .backends import DEMOTIONS, cublas_unavailable, triton_unavailable
from .fused import FusedUnavailable, run_fused
from .reference import INT32_SAFE_MAX_K
from .registry import PATH_CUBLAS, PATH_DEQUANT, PATH_RANK, PATH_TRITON, PATHS, REGISTRY

ENV_PATH = "IDEOGRAM4_INT8_GEMM_PATH"
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
_QUANT_PATHS = (PATH_TRITON, PATH_CUBLAS, PATH_DEQUANT)
# REGISTRY.launches key counting activation quantizations that divide by a SmoothQuant vector (any path): a
# model whose smoothing is folded at load (ideogram4.smooth_fold) runs none for its folded layers
QUANT_DIVIDE = "quant_divide"


class KernelInputError(ValueError):
    """Bad operands for a W8A8 kernel; the message names the argument and the fix."""


class GemmPathUnavailable(ValueError):
    """A path was forced through the ``path`` argument but cannot run here."""


# -- capability checks -------------------------------------------------------------------------


def triton_unavailable_reason(device: torch.device) -> str | None:
    """None when the fused Triton kernel can run on ``device``; else why not (for the panel)."""
    return triton_unavailable(device)


def _unavailable(path: str, device: torch.device, n: int, k: int) -> str | None:
    if path == PATH_TRITON:
        return triton_unavailable_reason(device)
    if path == PATH_CUBLAS:
        return cublas_unavailable(device, n, k)
    return None


def select_path(device: torch.device, n: int, k: int, path: str | None = None) -> tuple[str, str]:
    """(path, reason). ``reason`` says why a faster path was not taken ('' when fastest ran)."""
    # asked on every GEMM call: cached per inputs, including the environment switches it reads
    env = (
        os.environ.get(ENV_PATH, "").strip(),
        os.environ.get("TRITON_INTERPRET", ""),
        os.environ.get(cpu_gemm.ENV_CPU_GEMM, ""),
    )
    return _select_path_cached(device, n, k, path, env)


@functools.lru_cache(maxsize=4096)
def _select_path_cached(device, n, k, path, _env) -> tuple[str, str]:
    if path is not None:
        if path not in _QUANT_PATHS:
            raise GemmPathUnavailable(f"path={path!r}: expected one of {_QUANT_PATHS}")
        why = _unavailable(path, device, n, k)
        if why:
            raise GemmPathUnavailable(f"path={path!r} cannot run here: {why}")
        return path, _forced_reason(path, "path argument")
    env = os.environ.get(ENV_PATH, "").strip()
    if env:
        if env not in _QUANT_PATHS:
            return _auto(device, n, k, note=f"{ENV_PATH}={env!r} is not one of {_QUANT_PATHS}; ignored")
        why = _unavailable(env, device, n, k)
        if why is None:
            return env, _forced_reason(env, f"{ENV_PATH}={env}")
        return _auto(device, n, k, note=f"{ENV_PATH}={env} requested, but {why}")
    return _auto(device, n, k)


def _forced_reason(path: str, how: str) -> str:
    return "" if path == PATH_TRITON else f"forced by {how}"


def _auto(device: torch.device, n: int, k: int, note: str = "") -> tuple[str, str]:
    reasons = [note] if note else []
    for candidate in _QUANT_PATHS:
        if candidate == PATH_TRITON and device.type == "cpu":
            # The CPU interpreter is a test vehicle, never an automatic choice.
            reasons.append("CPU tensors: the fused Triton kernel needs a CUDA GPU (sm_80+)")
            continue
        why = _unavailable(candidate, device, n, k)
        if why is None and candidate == PATH_CUBLAS and device.type == "cpu":
            # no tensor cores: torch._int_mm is the fast CPU path only where it measured so (cpu_gemm)
            why = cpu_gemm.choice().why_not_int_mm()
        if why is None:
            return candidate, "; ".join(reasons)
        reasons.append(why)
    raise AssertionError("dequant-bf16 is always available")  # pragma: no cover


# -- input validation --------------------------------------------------------------------------


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
            "Keep nn.Linear weights as [N, K]: a [K, N] int8 operand is ~10x slower on tensor cores"
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


# -- public kernels ----------------------------------------------------------------------------


def quantize_per_token(x: torch.Tensor, smooth: torch.Tensor | None = None, convrot_group: int | None = None):
    """x [..., K] float -> (q int8 [..., K], scale float32 [...]).

    Divides by ``smooth`` [K] first when given, then (``convrot_group``) rotates each group of that many
    columns by ConvRot's Hadamard matrix (int8_convrot files); per-row absmax; round half-to-even; clamp
    +-127. A zero row gets scale 0; a row with NaN/Inf gets q = 0 and scale NaN (its output
    row is NaN, other rows are untouched). Runs the Triton kernel where it can, else the twin.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT_DTYPES:
        raise KernelInputError(f"quantize_per_token: x must be float32/float16/bfloat16; got {getattr(x, 'dtype', x)}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise KernelInputError(f"quantize_per_token: x must be [..., K] with K >= 1; got {tuple(x.shape)}")
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    smooth = _vector(smooth, k, "quantize_per_token: smooth", x.device)
    q, s = _quantize_rows(x2, smooth, _check_group(convrot_group, k, "quantize_per_token"))
    return q.reshape(*lead, k), s.reshape(lead)


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


def _quantize_rows(x2: torch.Tensor, smooth, group: int | None):
    """Per-token quantization of a validated [M, K] (unit column stride): the Triton kernel where it can run
    (the plain or the rotating one), else the twin."""
    fused = triton_unavailable_reason(x2.device) is None
    if smooth is not None:
        REGISTRY.count_launch(QUANT_DIVIDE)
    if group is None:
        if fused:
            from .quant_triton import quantize_rows_triton

            REGISTRY.count_launch("quant_triton")
            return quantize_rows_triton(x2, smooth)
        REGISTRY.count_launch("quant_twin")
        return reference.quantize_per_token_ref(x2, smooth)
    if smooth is not None:  # SmoothQuant before the rotation (no file layout carries both today)
        x2 = (x2.float() / smooth).to(x2.dtype)
    if fused:
        from .quant_triton import ROTATION_GROUPS, quantize_rotated_rows_triton

        if group in ROTATION_GROUPS:
            REGISTRY.count_launch("quant_rotated_triton")
            return quantize_rotated_rows_triton(x2, group)
        REGISTRY.count_launch("quant_triton")
        from .quant_triton import quantize_rows_triton

        return quantize_rows_triton(reference.rotate_ref(x2, group))
    REGISTRY.count_launch("quant_twin")
    return reference.quantize_rotated_ref(x2, group)


def _out_buffer(out, m, n, dtype, device, where):
    if out is None:
        return torch.empty((m, n), dtype=dtype, device=device)
    if out.shape != (m, n) or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise KernelInputError(
            f"{where}: out must be a contiguous {dtype} tensor of shape [{m}, {n}] on {device}; "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    return out


def _launch_fused(q, w, q_scale, w_scale, bias, out_dtype, raw_int32, out=None, swiglu_chunk=None, timed=None):
    """The fused path (fused.run_fused) into ``out`` or a new buffer: (out, config, source)."""
    m, n = q.shape[0], w.shape[0]
    n_out = n // 2 if swiglu_chunk else n
    out = _out_buffer(out, m, n_out, torch.int32 if raw_int32 else out_dtype, q.device, "int8_matmul")
    out, cfg, source = run_fused(q, w, q_scale, w_scale, bias, out, raw_int32, swiglu_chunk, timed)
    if cfg is not None:
        REGISTRY.count_launch("gemm_triton")
    return out, cfg, source


def _launch_fused_strict(*args, where: str, **kwargs):
    try:
        return _launch_fused(*args, **kwargs)
    except FusedUnavailable as exc:
        raise GemmPathUnavailable(f"{where}: the fused Triton kernel failed for this shape: {exc}") from exc


def _fused_guard(q: torch.Tensor, where: str) -> None:
    why = triton_unavailable_reason(q.device)
    if why:
        raise GemmPathUnavailable(
            f"{where}: the fused Triton kernel cannot run here: {why}. Use w8a8_linear for a labelled fallback"
        )


def int8_matmul(q, w, q_scale, w_scale, bias=None, out_dtype=torch.bfloat16, out=None):
    """Fused kernel: out[m,n] = out_dtype((acc[m,n] * q_scale[m]) * w_scale[n] + bias[n]).

    ``out`` (optional) is written in place: tests poison it to prove every element is written.
    """
    _check_operands(q, w, where="int8_matmul")
    _fused_guard(q, "int8_matmul")
    m, n = q.shape[0], w.shape[0]
    q_scale = _vector(q_scale, m, "int8_matmul: q_scale", q.device)
    w_scale = _vector(w_scale, n, "int8_matmul: w_scale", q.device)
    bias = _vector(bias, n, "int8_matmul: bias", q.device, keep_half=True)
    if out_dtype not in _FLOAT_DTYPES:
        raise KernelInputError(f"int8_matmul: out_dtype must be float32/float16/bfloat16; got {out_dtype}")
    out, _, _ = _launch_fused_strict(
        q, w, q_scale, w_scale, bias, out_dtype, raw_int32=False, out=out, where="int8_matmul"
    )
    return out


def int8_matmul_int32(q, w, out=None):
    """The same fused kernel, returning the raw int32 accumulator [M, N] (for bit-exactness checks)."""
    _check_operands(q, w, where="int8_matmul_int32")
    _fused_guard(q, "int8_matmul_int32")
    out, _, _ = _launch_fused_strict(q, w, None, None, None, None, raw_int32=True, out=out, where="int8_matmul_int32")
    return out


def _int_mm_padded(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """torch._int_mm with cuBLASLt's M > 16 requirement met by zero-padding rows."""
    m = q.shape[0]
    if q.is_cuda and m <= 16:
        q = torch.cat([q, q.new_zeros((17 - m, q.shape[1]))])
    return torch._int_mm(q, w.t())[:m]


_EPILOGUE_SHAPE = ("epilogue",)  # the demotion key of the cuBLAS path's Triton epilogue (one kernel, any shape)


def _cublas_linear(q, s, w, w_scale, bias, out_dtype):
    acc = _int_mm_padded(q, w)
    REGISTRY.count_launch("int_mm")
    if acc.is_cuda and triton_unavailable_reason(acc.device) is None and not DEMOTIONS.get("triton", _EPILOGUE_SHAPE):
        from .gemm_triton import apply_epilogue

        try:
            return apply_epilogue(acc, s, w_scale, bias, out_dtype)
        except Exception as exc:  # noqa: BLE001 - the torch epilogue below computes the same function
            DEMOTIONS.demote("triton", _EPILOGUE_SHAPE, exc, "Triton epilogue kernel")
    return reference.epilogue_ref(acc, s, w_scale, bias, out_dtype)


def w8a8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    smooth: torch.Tensor | None = None,
    path: str | None = None,
    site: str | None = None,
    out_dtype: torch.dtype | None = None,
    convrot_group: int | None = None,
) -> torch.Tensor:
    """y = dequant(int8(x / smooth) . w^T) + bias for x [..., K], w int8 [N, K], w_scale [N].

    ``path`` forces a path (strict); ``site`` names the call site in the registry. The output
    dtype is x's dtype unless ``out_dtype`` is given. ``convrot_group``: ``w`` is stored ConvRot-rotated
    (ComfyUI's int8_convrot), so the activation is rotated the same way inside its quantization.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT_DTYPES:
        raise KernelInputError(f"w8a8_linear: x must be float32/float16/bfloat16; got {getattr(x, 'dtype', x)}")
    _check_int8_2d(w, "w8a8_linear: w")
    n, k = w.shape
    if x.dim() < 1 or x.shape[-1] != k:
        raise KernelInputError(f"w8a8_linear: x is {tuple(x.shape)} but w is [N={n}, K={k}]; x's last dim must be K")
    if x.device != w.device:
        raise KernelInputError(f"w8a8_linear: x on {x.device}, w on {w.device}; move the weight to the input's device")
    _check_k(k, "w8a8_linear")
    chosen, reason = select_path(x.device, n, k, path)
    w_scale = _vector(w_scale, n, "w8a8_linear: w_scale", x.device)
    bias_v = _vector(bias, n, "w8a8_linear: bias", x.device, keep_half=chosen == PATH_TRITON)
    smooth = _vector(smooth, k, "w8a8_linear: smooth", x.device)
    group = _check_group(convrot_group, k, "w8a8_linear")
    out_dtype = out_dtype or x.dtype

    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    try:
        with _timed_unless_fused(chosen, x.device):
            y, cfg, source = _w8a8_compute(x2, w, w_scale, bias_v, smooth, chosen, out_dtype, group)
    except FusedUnavailable as exc:  # the portable kernel failed for this shape: the next path, labelled
        chosen, reason = _after_fused_failure(x.device, n, k, exc)
        bias_v = _vector(bias, n, "w8a8_linear: bias", x.device)
        with REGISTRY.timed(chosen, x.device):
            y, cfg, source = _w8a8_compute(x2, w, w_scale, bias_v, smooth, chosen, out_dtype, group)
    REGISTRY.record(
        site,
        chosen,
        reason,
        m,
        n,
        k,
        dtype=x.dtype,
        config=cfg.key() if cfg is not None else None,
        config_source=source,
    )
    return y.reshape(*lead, n)


def _timed_unless_fused(chosen: str, device: torch.device):
    """GEMM timing around a whole linear, except on the fused path: that one times its activation quantization
    and its launch itself (``_launch_fused``), so a shape's one-time autotuning is never counted."""
    return contextlib.nullcontext() if chosen == PATH_TRITON else REGISTRY.timed(chosen, device)


def _after_fused_failure(device: torch.device, n: int, k: int, exc: FusedUnavailable) -> tuple[str, str]:
    """(path, reason) after the fused kernel failed for a shape: cuBLAS int8 where it runs, else dequant-bf16."""
    chosen = PATH_CUBLAS if cublas_unavailable(device, n, k) is None else PATH_DEQUANT
    return chosen, f"the fused Triton kernel failed for this shape: {exc}"


def _w8a8_compute(x2, w, w_scale, bias, smooth, chosen, out_dtype, group=None):
    """The linear on an already chosen path (no validation, no recording): (y, config, source).

    Timing: the caller's for the unfused paths (``_timed_unless_fused``); the fused path times itself.
    """
    if chosen == PATH_DEQUANT:
        if smooth is not None:
            REGISTRY.count_launch(QUANT_DIVIDE)
        if group is not None:  # the phantom path rotates in float, then dequantizes
            xs = x2 if smooth is None else (x2.float() / smooth).to(x2.dtype)
            x2, smooth = reference.rotate_ref(xs, group), None
        y = reference.dequant_linear_ref(x2, w, w_scale, bias, smooth, compute_dtype=dequant_dtype(x2))
        return y.to(out_dtype), None, None
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if chosen == PATH_TRITON:
        with REGISTRY.timed(PATH_TRITON, x2.device):
            q, s = _quantize_rows(x2, smooth, group)  # operands already validated: no public checks
        return _launch_fused(q, w, s, w_scale, bias, out_dtype, raw_int32=False, timed=PATH_TRITON)
    q, s = _quantize_rows(x2, smooth, group)
    return _cublas_linear(q, s, w, w_scale, bias, out_dtype), None, None


def dequant_dtype(x: torch.Tensor) -> torch.dtype:
    """The float dtype of the dequantized matmul: x's on a GPU; on a CPU float32 (a CPU without bf16 units runs a
    bf16 matmul ~10x slower), or bf16 for bf16 inputs where bf16 measured faster (cpu_gemm)."""
    if x.device.type != "cpu" or x.dtype == torch.float32:
        return x.dtype
    fast = cpu_gemm.choice().float_dtype
    return torch.bfloat16 if x.dtype == torch.bfloat16 and fast == torch.bfloat16 else torch.float32


def float_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    site: str | None = None,
    reason: str = "unquantized layer",
) -> torch.Tensor:
    """A plain float linear that still shows up in the registry as path 'bf16'."""
    n, k = weight.shape
    with REGISTRY.timed("bf16", x.device):
        y = F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    REGISTRY.record(site, "bf16", reason, x.numel() // max(k, 1), n, k, dtype=x.dtype)
    return y


def slower_than(path: str) -> list[str]:
    """Paths faster than ``path`` (for 'why not faster' explanations)."""
    return [p for p in PATHS if PATH_RANK[p] < PATH_RANK[path]]


# -- fused gate/up projection with SwiGLU (Ideogram 4's feed_forward.w1 / w3) ----------------------


def swiglu_chunk_for(f: int) -> int | None:
    """Interleave chunk for a gate/up pair of width f: the largest of 128/64/32/16 dividing f."""
    return next((c for c in (128, 64, 32, 16) if f % c == 0), None)


def interleave_gate_up(w1, s1, w3, s3, chunk: int):
    """Stack gate (w1) and up (w3) int8 rows as [g0 | u0 | g1 | u1 | ...] in chunks of ``chunk``
    rows, so one BLOCK_N = 2 x chunk output tile holds matching gate and up columns."""
    f, k = w1.shape
    if w3.shape != (f, k) or f % chunk:
        raise KernelInputError(f"interleave_gate_up: w1 {tuple(w1.shape)} / w3 {tuple(w3.shape)} with chunk {chunk}")
    w13 = torch.stack([w1.reshape(f // chunk, chunk, k), w3.reshape(f // chunk, chunk, k)], dim=1)
    s13 = torch.stack([s1.reshape(f // chunk, chunk), s3.reshape(f // chunk, chunk)], dim=1)
    return w13.reshape(2 * f, k).contiguous(), s13.reshape(2 * f).float().contiguous()


def deinterleave_gate_up(y13: torch.Tensor, chunk: int):
    """Inverse of the interleaving on the output's last dim: (gate, up)."""
    lead, n2 = y13.shape[:-1], y13.shape[-1]
    y = y13.reshape(*lead, n2 // (2 * chunk), 2, chunk)
    return y[..., 0, :].reshape(*lead, n2 // 2), y[..., 1, :].reshape(*lead, n2 // 2)


def swiglu_w8a8_linear(x, w13, s13, chunk, smooth=None, path=None, site=None, out_dtype=None):
    """h = silu(x W1^T) * (x W3^T) with W1|W3 interleaved (``interleave_gate_up``) as one W8A8 GEMM.

    On the fused path the SwiGLU runs in the GEMM epilogue in float32 and h is written once;
    other paths compute both projections and apply SwiGLU in float32 afterwards.
    """
    _check_int8_2d(w13, "swiglu_w8a8_linear: w13")
    n2, k = w13.shape
    if not chunk or n2 % (2 * chunk):
        raise KernelInputError(f"swiglu_w8a8_linear: w13 has {n2} rows, not a multiple of 2 x chunk={chunk}")
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT_DTYPES or x.shape[-1] != k:
        raise KernelInputError(f"swiglu_w8a8_linear: x must be float [..., {k}]; got {getattr(x, 'shape', x)}")
    out_dtype = out_dtype or x.dtype
    s13 = _vector(s13, n2, "swiglu_w8a8_linear: s13", x.device)
    smooth = _vector(smooth, k, "swiglu_w8a8_linear: smooth", x.device)
    chosen, reason = select_path(x.device, n2, k, path)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    cfg = source = h = None
    if chosen == PATH_TRITON:
        with REGISTRY.timed(PATH_TRITON, x.device):
            q, s = quantize_per_token(x2, smooth)
        try:
            h, cfg, source = _launch_fused(
                q, w13, s, s13, None, out_dtype, False, swiglu_chunk=chunk, timed=PATH_TRITON
            )
        except FusedUnavailable as exc:  # the portable kernel failed for this shape: the next path, labelled
            chosen, reason = _after_fused_failure(x.device, n2, k, exc)
    if h is None:
        with REGISTRY.timed(chosen, x.device):
            y, _, _ = _w8a8_compute(x2, w13, s13, None, smooth, chosen, torch.float32)
            g, u = deinterleave_gate_up(y, chunk)
            h = (F.silu(g) * u).to(out_dtype)
    REGISTRY.record(
        site,
        chosen,
        reason,
        x2.shape[0],
        n2,
        k,
        dtype=x.dtype,
        config=cfg.key() if cfg is not None else None,
        config_source=source,
    )
    return h.reshape(*lead, n2 // 2)


FUSION_ONE_GEMM = "gate/up pair: one GEMM with the SwiGLU epilogue, w1 and w3 read in place"
FUSION_ONE_QUANT = "gate/up pair: one activation quantization, two GEMMs, SwiGLU in float32"
FUSION_DEQUANT = "gate/up pair: two dequantized float GEMMs, SwiGLU in float32"


def swiglu_w8a8_pair(x, w1, s1, w3, s3, smooth=None, path=None, site=None, out_dtype=None, convrot_group=None):
    """h = silu(x W1^T) * (x W3^T) for x [..., K] and two int8 weights w1 (gate), w3 (up) [F, K] with their
    per-channel scales s1, s3 [F]: the gate/up pair without an interleaved copy of the weights.

    On the fused path one activation quantization and one GEMM that reads the gate and up tiles from the two
    tensors, with the SwiGLU in its epilogue (float32, the same ops in the same order as
    ``swiglu_w8a8_linear``'s: bit for bit its result for the interleaved weights). Other paths (and a fused
    kernel that fails for the shape, labelled) quantize once, run both projections and apply the SwiGLU in
    float32. ``path`` forces a path (strict), as for ``w8a8_linear``. ``site``: one call site (recorded as
    the pair, N = 2F) or a tuple (gate site, up site), each recorded as its own [F, K] projection; every
    record says how the pair ran (``fusion``). ``convrot_group``: both weights are ConvRot-rotated (int8_convrot
    files): the activation is rotated inside its one quantization.
    """
    _check_int8_2d(w1, "swiglu_w8a8_pair: w1")
    _check_int8_2d(w3, "swiglu_w8a8_pair: w3")
    f, k = w1.shape
    if w3.shape != w1.shape:
        raise KernelInputError(
            f"swiglu_w8a8_pair: w1 is {tuple(w1.shape)} but w3 is {tuple(w3.shape)}; "
            "the gate and up projections must have one shape [F, K]"
        )
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOAT_DTYPES or x.dim() < 1 or x.shape[-1] != k:
        raise KernelInputError(f"swiglu_w8a8_pair: x must be float [..., {k}]; got {getattr(x, 'shape', x)}")
    if not (x.device == w1.device == w3.device):
        raise KernelInputError(
            f"swiglu_w8a8_pair: x on {x.device}, w1 on {w1.device}, w3 on {w3.device}; move the "
            "weights to the input's device"
        )
    _check_k(k, "swiglu_w8a8_pair")
    out_dtype = out_dtype or x.dtype
    s1 = _vector(s1, f, "swiglu_w8a8_pair: s1", x.device)
    s3 = _vector(s3, f, "swiglu_w8a8_pair: s3", x.device)
    smooth = _vector(smooth, k, "swiglu_w8a8_pair: smooth", x.device)
    group = _check_group(convrot_group, k, "swiglu_w8a8_pair")
    chosen, reason = select_path(x.device, f, k, path)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    cfg = source = h = q = s = None
    if chosen == PATH_TRITON:
        with REGISTRY.timed(PATH_TRITON, x.device):
            q, s = _quantize_rows(x2, smooth, group)
        try:
            out = _out_buffer(None, q.shape[0], f, out_dtype, q.device, "swiglu_w8a8_pair")
            h, cfg, source = run_fused(q, w1, s, s1, None, out, False, timed=PATH_TRITON, up=(w3, s3))
            if cfg is not None:
                REGISTRY.count_launch("gemm_triton")
                REGISTRY.count_launch("gate_up_pair")
        except FusedUnavailable as exc:  # the portable kernel failed for this shape: the next path, labelled
            chosen, reason = _after_fused_failure(x.device, f, k, exc)
    if h is None:
        with REGISTRY.timed(chosen, x.device):
            h = _pair_unfused(x2, q, s, w1, s1, w3, s3, smooth, chosen, out_dtype, group)
    fusion = {PATH_TRITON: FUSION_ONE_GEMM, PATH_DEQUANT: FUSION_DEQUANT}.get(chosen, FUSION_ONE_QUANT)
    conf = cfg.key() if cfg is not None else None
    m = x2.shape[0]
    if isinstance(site, tuple):
        for one in site:
            REGISTRY.record(
                one, chosen, reason, m, f, k, dtype=x.dtype, config=conf, config_source=source, fusion=fusion
            )
    else:
        REGISTRY.record(
            site, chosen, reason, m, 2 * f, k, dtype=x.dtype, config=conf, config_source=source, fusion=fusion
        )
    return h.reshape(*lead, f)


def _pair_unfused(x2, q, s, w1, s1, w3, s3, smooth, chosen, out_dtype, group=None):
    """The gate/up pair on an unfused path: both projections in float32 from one quantization (cuBLAS int8),
    or both dequantized (dequant-bf16), then silu(g) * u in float32."""
    if chosen == PATH_DEQUANT:
        g = _w8a8_compute(x2, w1, s1, None, smooth, PATH_DEQUANT, torch.float32, group)[0]
        u = _w8a8_compute(x2, w3, s3, None, smooth, PATH_DEQUANT, torch.float32, group)[0]
    else:
        if q is None:
            q, s = _quantize_rows(x2, smooth, group)
        g = _cublas_linear(q, s, w1, s1, None, torch.float32)
        u = _cublas_linear(q, s, w3, s3, None, torch.float32)
    return (F.silu(g) * u).to(out_dtype)


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float):
    """Per-head RMSNorm + split-half RoPE of q or k [B, N, H, D] (e.g. a strided view of the qkv
    output) -> contiguous [B, N, H, D]. One Triton pass where it can run, else the twin."""
    if x.dim() != 4 or cos.shape != (x.shape[1], x.shape[3] // 2) or sin.shape != cos.shape:
        raise KernelInputError(
            f"qk_norm_rope: x must be [B, N, H, D] with cos/sin [N, D/2]; got {tuple(x.shape)}, {tuple(cos.shape)}"
        )
    half = x.shape[-1] // 2
    fused_ok = (
        x.stride(-1) == 1
        and half >= 16
        and half & (half - 1) == 0
        and triton_unavailable_reason(x.device) is None
        and weight.device == x.device
    )
    if not fused_ok:
        return reference.qk_norm_rope_ref(x, weight, cos, sin, eps)
    from .qk_norm_rope_triton import qk_norm_rope_triton

    REGISTRY.count_launch("qk_norm_rope_triton")
    return qk_norm_rope_triton(x, weight.contiguous(), cos.float().contiguous(), sin.float().contiguous(), eps)
