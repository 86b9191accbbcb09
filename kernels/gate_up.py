"""The SwiGLU gate/up projection entry point (Ideogram 4's feed_forward.w1 / w3): h = silu(x W1^T) * (x W3^T).

``swiglu_w8a8_pair`` reads the two int8 weights as they are. On the fused path the SwiGLU runs in the GEMM
epilogue; the other paths run dispatch.py's path runners and apply it in float32. Every call is recorded in
``registry.REGISTRY``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import _cublas_linear, _quantize_rows, _w8a8_compute
from .fused import FusedUnavailable, run_fused
from .operands import _FLOAT_DTYPES, KernelInputError, _check_group, _check_int8_2d, _check_k, _out_buffer, _vector
from .path_choice import select_after_fused_failure, select_path
from .registry import PATH_DEQUANT, PATH_TRITON, REGISTRY

FUSION_ONE_GEMM = "gate/up pair: one GEMM with the SwiGLU epilogue, w1 and w3 read in place"


FUSION_ONE_QUANT = "gate/up pair: one activation quantization, two GEMMs, SwiGLU in float32"


FUSION_DEQUANT = "gate/up pair: two dequantized float GEMMs, SwiGLU in float32"


def swiglu_w8a8_pair(x, w1, s1, w3, s3, smooth=None, path=None, site=None, out_dtype=None, convrot_group=None):
    """h = silu(x W1^T) * (x W3^T) for x [..., K] and two int8 weights w1 (gate), w3 (up) [F, K] with their
    per-channel scales s1, s3 [F].

    On the fused path one activation quantization and one GEMM that reads the gate and up tiles from the two
    tensors, with the SwiGLU in its epilogue (float32). Other paths (and a fused kernel that fails for the
    shape, labelled) quantize once, run both projections and apply the SwiGLU in float32. ``path`` forces a
    path (strict), as for ``w8a8_linear``. ``site``: one call site (recorded as the pair, N = 2F) or a tuple
    (gate site, up site), each recorded as its own [F, K] projection; every record says how the pair ran
    (``fusion``). ``convrot_group``: both weights are ConvRot-rotated (int8_convrot files): the activation is
    rotated inside its one quantization.
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
            chosen, reason = select_after_fused_failure(x.device, f, k, exc)
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
