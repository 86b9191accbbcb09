"""Public W8A8 entry points and the runners of the GEMM paths.

``quantize_per_token``, ``int8_matmul``, ``int8_matmul_int32``, ``w8a8_linear``, ``float_linear``,
``qk_norm_rope`` and the block's modulated norms (``rms_norm_modulate``, ``rms_norm_gated_residual``); the
gate/up (SwiGLU) entry points in gate_up.py share the path runners below. A call checks
its operands (operands.py), runs the path path_choice.py picks and records it, with the reason a faster one
was not taken, in ``registry.REGISTRY``; a fused kernel that fails for a shape falls back to the next path,
labelled.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from . import capture_guard, handoff, reference
from .backends import DEMOTIONS, unavailable
from .fused import FusedUnavailable, run_fused
from .operands import (
    _FLOAT_DTYPES,
    KernelInputError,
    _check_group,
    _check_int8_2d,
    _check_k,
    _check_operands,
    _out_buffer,
    _vector,
)
from .path_choice import GemmPathUnavailable, dequant_dtype, select_after_fused_failure, select_path
from .registry import PATH_DEQUANT, PATH_TRITON, REGISTRY

# REGISTRY.launches key counting activation quantizations that divide by a SmoothQuant vector (any path): a
# model whose smoothing is folded at load (ideogram4.smooth_fold) runs none for its folded layers
QUANT_DIVIDE = "quant_divide"
# REGISTRY.launches key counting activation quantizations taken over from their producer (handoff.py): no kernel
QUANT_HANDOFF = "quant_handoff"


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


def _quantize_rows(x2: torch.Tensor, smooth, group: int | None, codes=torch.int8):
    """Per-token quantization of a validated [M, K] (unit column stride): the Triton kernel where it can run
    (the plain or the rotating one), else the twin. A kernel variant that fails to build or launch is demoted with
    its reason (``_unless_demoted``) and its calls take the twin: the same codes and scales. ``codes``
    torch.float8_e4m3fn: e4m3 codes for the ``triton-fp8`` path (fp8_gemm.py; nothing to divide or rotate there, and
    a pre-norm's handed-over rows are int8: none claimed)."""
    if smooth is None and group is None and codes == torch.int8:
        handed = handoff.claim(x2)  # its producer quantized it already (a block's pre-norm)
        if handed is not None:
            REGISTRY.count_launch(QUANT_HANDOFF)
            return handed
    fused = unavailable("triton", x2.device) is None
    if smooth is not None:
        REGISTRY.count_launch(QUANT_DIVIDE)
    if group is not None and smooth is not None:  # SmoothQuant before the rotation (no file layout carries both)
        x2 = (x2.float() / smooth).to(x2.dtype)
        smooth = None
    out = _quantize_rows_triton(x2, smooth, group, codes) if fused else None
    if out is not None:
        return out
    REGISTRY.count_launch("quant_twin")
    if group is None:
        return reference.quantize_per_token_ref(x2, smooth, codes=codes)
    return reference.quantize_rotated_ref(x2, group)


def _quantize_rows_triton(x2: torch.Tensor, smooth, group: int | None, codes=torch.int8):
    """The Triton quantizer for this call (the rotating kernel for ConvRot's groups it knows, the plain one after a
    torch rotation for other groups), or None where its variant failed (now or before)."""
    from . import quant_triton

    variant = (x2.shape[1], str(x2.dtype).removeprefix("torch."), smooth is not None, group)
    if group in quant_triton.ROTATION_GROUPS:
        key, run = ("quantize_rotated", *variant), lambda: quant_triton.quantize_rotated_rows_triton(x2, group)
        counter = "quant_rotated_triton"
    else:

        def run():  # a group the rotating kernel does not know: rotated by torch first (only when the kernel runs)
            rows = x2 if group is None else reference.rotate_ref(x2, group)
            return quant_triton.quantize_rows_triton(rows, smooth, codes=codes)

        fp8 = codes != torch.int8
        key = ("quantize", *variant, "e4m3") if fp8 else ("quantize", *variant)
        counter = "quant_fp8_triton" if fp8 else "quant_triton"
    out = _unless_demoted(key, "Triton activation quantizer", run, x2.device)
    if out is not None:
        REGISTRY.count_launch(counter)
    return out


def _launch_fused(q, w, q_scale, w_scale, bias, out_dtype, raw_int32, out=None, timed=None):
    """The fused path (fused.run_fused) into ``out`` or a new buffer: (out, config, source)."""
    m, n = q.shape[0], w.shape[0]
    out = _out_buffer(out, m, n, torch.int32 if raw_int32 else out_dtype, q.device, "int8_matmul")
    out, cfg, source = run_fused(q, w, q_scale, w_scale, bias, out, raw_int32, timed=timed)
    if cfg is not None:
        REGISTRY.count_launch("gemm_triton")
    return out, cfg, source


def _launch_fused_strict(*args, where: str, **kwargs):
    try:
        return _launch_fused(*args, **kwargs)
    except FusedUnavailable as exc:
        raise GemmPathUnavailable(f"{where}: the fused Triton kernel failed for this shape: {exc}") from exc


def _fused_guard(q: torch.Tensor, where: str) -> None:
    why = unavailable("triton", q.device)
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


def _unless_demoted(shape: tuple, what: str, run, device: torch.device):
    """``run()``, the Triton variant ``shape`` (its demotion key), unless it failed before; None where it fails now
    (demoted with the error as its reason, ``DEMOTIONS``) or did: the caller runs the twin instead. A failure
    inside a CUDA graph capture on ``device`` is the capture's: raised, nothing demoted."""
    if DEMOTIONS.get("triton", shape):
        return None
    try:
        return run()
    except torch.cuda.OutOfMemoryError:  # the card is short of memory now, not the variant: nothing to demote (the
        raise  # twin would need more), the caller's OOM handling sees it as before
    except Exception as exc:  # noqa: BLE001 - the caller's twin computes the same function
        if capture_guard.capturing(device):
            raise
        DEMOTIONS.demote("triton", shape, exc, what)
        return None


def _demotion_of(kernel: str) -> str | None:
    """Why a variant of the Triton ``kernel`` (its demotion keys' first item) was demoted, or None."""
    return next(
        (d["reason"] for d in DEMOTIONS.items() if d["backend"] == "triton" and d["shape"][:1] == [kernel]), None
    )


def _cublas_linear(q, s, w, w_scale, bias, out_dtype):
    acc = _int_mm_padded(q, w)
    REGISTRY.count_launch("int_mm")
    if acc.is_cuda and unavailable("triton", acc.device) is None:
        from .gemm_triton import apply_epilogue

        out = _unless_demoted(
            _EPILOGUE_SHAPE,
            "Triton epilogue kernel",
            lambda: apply_epilogue(acc, s, w_scale, bias, out_dtype),
            acc.device,
        )
        if out is not None:
            return out
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
        chosen, reason = select_after_fused_failure(x.device, n, k, exc)
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


QK_ROPE_KERNEL = "Triton q/k norm + RoPE kernel (qk_norm_rope)"  # the demotion record's name of the kernel


def qk_rope_demotion() -> str | None:
    """Why the q/k norm + RoPE kernel was demoted for some head size and dtype (calls there run the twin), or None."""
    return _demotion_of("qk_norm_rope")


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float):
    """Per-head RMSNorm + split-half RoPE of q or k [B, N, H, D] (e.g. a strided view of the qkv
    output) -> contiguous [B, N, H, D]. One Triton pass where it can run and has not failed for this head size and
    dtype (else demoted with its reason, ``qk_rope_demotion``), else the twin."""
    if x.dim() != 4 or cos.shape != (x.shape[1], x.shape[3] // 2) or sin.shape != cos.shape:
        raise KernelInputError(
            f"qk_norm_rope: x must be [B, N, H, D] with cos/sin [N, D/2]; got {tuple(x.shape)}, {tuple(cos.shape)}"
        )
    half = x.shape[-1] // 2
    fused_ok = (
        x.stride(-1) == 1
        and half >= 16
        and half & (half - 1) == 0
        and unavailable("triton", x.device) is None
        and weight.device == x.device
    )
    out = None
    if fused_ok:
        shape = ("qk_norm_rope", x.shape[-1], str(x.dtype).removeprefix("torch."))

        def run():
            from .qk_norm_rope_triton import qk_norm_rope_triton

            return qk_norm_rope_triton(x, weight.contiguous(), cos.float().contiguous(), sin.float().contiguous(), eps)

        out = _unless_demoted(shape, QK_ROPE_KERNEL, run, x.device)
    if out is None:
        return reference.qk_norm_rope_ref(x, weight, cos, sin, eps)
    REGISTRY.count_launch("qk_norm_rope_triton")
    return out


def _modulation_rows(x: torch.Tensor, vector: torch.Tensor) -> torch.Tensor | None:
    """The [B or 1, C] rows of a block's modulation vector [B or 1, 1, C] for x [B, N, C], or None when the fused
    kernel cannot read them (then the twin runs: it broadcasts as torch does)."""
    B, _, C = x.shape
    if vector.dim() != 3 or vector.shape[1] != 1 or vector.shape[2] != C or vector.shape[0] not in (1, B):
        return None
    if vector.dtype != x.dtype or vector.device != x.device or vector.stride(-1) != 1:
        return None
    return vector[:, 0, :]


def _rms_fused_ok(x: torch.Tensor, weight: torch.Tensor, *others: torch.Tensor) -> bool:
    return (
        x.dtype in (torch.bfloat16, torch.float16)
        and x.is_contiguous()
        and all(t.is_contiguous() and t.shape == x.shape and t.dtype == x.dtype for t in others)
        and weight.device == x.device
        and weight.shape == (x.shape[-1],)
        and unavailable("triton", x.device) is None
    )


BLOCK_NORM_KERNEL = "Triton block-norm kernel (rms_modulate)"  # the demotion record's name of the kernel


def block_norm_demotion() -> str | None:
    """Why the block-norm kernel was demoted for some shape (its calls there run the twin), or None."""
    return _demotion_of("rms_modulate")


def _rms_modulate_rows(src, residual, weight, rows, eps: float, hand_off: bool = False) -> torch.Tensor | None:
    """The Triton kernel on validated [B, N, C] operands (``residual`` None: the pre-norm), counted; ``hand_off``:
    the output's int8 form is offered to the next quantizer (handoff.py). None where the kernel failed for this
    variant, now or before (demoted with its reason, ``DEMOTIONS``): the caller runs the twin."""
    B, N, C = src.shape
    res = None if residual is None else residual.view(B * N, C)

    def run():
        from .rms_modulate_triton import rms_modulate_triton

        return rms_modulate_triton(src.view(B * N, C), res, weight.to(src.dtype).contiguous(), rows, N, eps, hand_off)

    out = _unless_demoted(("rms_modulate", C, residual is not None, hand_off), BLOCK_NORM_KERNEL, run, src.device)
    if out is None:
        return None
    REGISTRY.count_launch("rms_modulate_triton")
    if hand_off:
        out, q, scale = out
        handoff.offer(out, q, scale)
    return out.view(B, N, C)


def _check_block_operands(x, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.dtype not in _FLOAT_DTYPES:
        raise KernelInputError(f"{name}: x must be a float [B, N, C] tensor; got {getattr(x, 'shape', x)}")


def rms_norm_modulate(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, eps: float, hand_off: bool = False
) -> torch.Tensor:
    """``F.rms_norm(x, weight) * scale`` for a block's x [B, N, C] and its ``1 + scale`` modulation [B or 1, 1, C],
    in one Triton pass where it can run (rms_modulate_triton.py), else the twin.

    ``hand_off``: the pass also quantizes its output per token, and the next quantization of that output with
    nothing to divide or rotate (the linear it feeds) takes the result instead of reading it again (handoff.py;
    the caller ``handoff.clear()``s after that linear). The twin hands nothing off."""
    _check_block_operands(x, "rms_norm_modulate")
    rows = _modulation_rows(x, scale)
    out = None
    if rows is not None and _rms_fused_ok(x, weight):
        out = _rms_modulate_rows(x, None, weight, rows, eps, hand_off)
    return reference.rms_norm_modulate_ref(x, weight, scale, eps) if out is None else out


def rms_norm_gated_residual(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float
) -> torch.Tensor:
    """``x + gate * F.rms_norm(y, weight)`` for a block's residual x [B, N, C], the attention's or FFN's output y
    and its ``tanh(gate)`` [B or 1, 1, C], in one Triton pass where it can run, else the twin."""
    _check_block_operands(x, "rms_norm_gated_residual")
    rows = _modulation_rows(x, gate)
    out = None
    if rows is not None and _rms_fused_ok(x, weight, y):
        out = _rms_modulate_rows(y, x, weight, rows, eps)
    return reference.rms_norm_gated_residual_ref(x, y, weight, gate, eps) if out is None else out
