"""The pack's W8A8 entry points as registered torch custom ops, for ``torch.compile`` and CUDA graphs.

Under ``torch.compile`` dynamo traces Python. The entry points (``dispatch.py``, ``gate_up.py``) pick a GEMM path,
record it in the registry, time it, count launches, pick tile configs and demote failing backends: Python bookkeeping
on mutable state that dynamo cannot put in a graph (graph breaks) or guards on (a recompile per layer or step).
So each entry point is also a custom op, ``torch.ops.ideogram4_int8.<name>``, whose real implementation is the
eager function itself: opaque to dynamo, it runs all that bookkeeping at run time, exactly as in eager mode.
Each op has a fake implementation giving the output's shape, dtype and device, which is all the tracer needs.

Module forwards call the helpers below (``w8a8_linear``, ``float_linear``, ``fp8_linear``, ``swiglu_w8a8_pair``,
``qk_norm_rope``): under ``torch.compiler.is_compiling()`` they emit the op, otherwise
they call the eager function directly (no dispatcher round trip: a step's host time matters). Their string and
int arguments (path, ConvRot group) are constants of the traced graph, read from module attributes that do not
change between steps; nothing reads the registry in traced code. A per-layer site would be a constant that differs
between blocks sharing one forward (a recompile per block): a module whose weight is resident passes none, and the
op looks the site up by that weight at run time (``sites.py``; ``w8a8_linear``, ``float_linear``, and
``swiglu_w8a8_pair`` with neither site).

Ops (every output is a new contiguous tensor, never a view of an input):
  w8a8_linear(x, w, w_scale, bias?, smooth?, path?, site?, out_dtype?, convrot_group?)    [..., N]
  float_linear(x, weight, bias?, site?, reason)                                            [..., N]
  fp8_linear(x, w, w_scale, bias?, site?, float_only?)                                      [..., N]
  swiglu_w8a8_pair(x, w1, s1, w3, s3, smooth?, path?, site?, up_site?, out_dtype?, convrot_group?)  [..., F]
  qk_norm_rope(x, weight, cos, sin, eps)                                                   [B, N, H, D]

Under CUDA-graph replay no Python runs: the registry and counters see the captured run only. If this torch cannot
register custom ops (older than 2.4) or a registration fails, ``OPS_UNAVAILABLE`` says why and the helpers call the
eager functions under compile too (correct, with graph breaks).
"""

import collections
import logging
from typing import Optional

import torch
from torch import Tensor

from . import dispatch, fp8_gemm, gate_up, operands
from .registry import REGISTRY
from .sites import SITES

log = logging.getLogger(__name__)

NAMESPACE = "ideogram4_int8"
# appended to the registry reason of a ConvRot layer (the panel shows it)
CONVROT_NOTE = "ConvRot weight: the activation is rotated inside its quantizer (int8_convrot)"


# True while dynamo traces (a constant in the traced code); bound once: the eager path asks it on every call
_is_compiling = torch.compiler.is_compiling


# -- real implementations: the eager functions plus the bookkeeping their module callers did -------------------


def w8a8_linear_impl(x, w, w_scale, bias=None, smooth=None, path=None, site=None, out_dtype=None, convrot_group=None):
    y = dispatch.w8a8_linear(
        x, w, w_scale, bias, smooth, path=path, site=site, out_dtype=out_dtype, convrot_group=convrot_group
    )
    if convrot_group is not None and site is not None:
        REGISTRY.annotate(site, CONVROT_NOTE)
    return y


def swiglu_w8a8_pair_impl(
    x, w1, s1, w3, s3, smooth=None, path=None, site=None, up_site=None, out_dtype=None, convrot_group=None
):
    """``site`` alone: the pair recorded as one call site; with ``up_site``: (gate site, up site)."""
    sites = (site, up_site) if up_site is not None else site
    h = gate_up.swiglu_w8a8_pair(
        x, w1, s1, w3, s3, smooth=smooth, path=path, site=sites, out_dtype=out_dtype, convrot_group=convrot_group
    )
    if convrot_group is not None:
        for one in (site, up_site):
            if one is not None:
                REGISTRY.annotate(one, CONVROT_NOTE)
    return h


# -- the ops ------------------------------------------------------------------------------------------------------

OPS_UNAVAILABLE: str | None = None
_OPS: dict = {}
# calls of the registered ops per call site (what a torch.compile'd graph ran; eager calls go straight to the
# functions and are counted by their callers): the ComfyUI path's op_coverage adds these to the modules' own counts
OP_CALLS: collections.Counter = collections.Counter()


def _count(*sites) -> None:
    for site in sites:
        if site is not None:
            OP_CALLS[site] += 1


UNNAMED = "(weight not tracked)"  # a compiled gate/up pair whose weight the site book does not know


def _register() -> None:
    global OPS_UNAVAILABLE
    if not hasattr(torch.library, "custom_op") or not hasattr(torch, "compiler"):
        OPS_UNAVAILABLE = f"torch {torch.__version__} has no torch.library.custom_op (2.4+)"
        return
    try:
        _define()
    except Exception as exc:  # noqa: BLE001 - never fail the import for compile support: eager still runs
        OPS_UNAVAILABLE = f"registering the pack's custom ops failed: {type(exc).__name__}: {exc}"
        _OPS.clear()
        log.warning("Ideogram4 INT8: %s; torch.compile will break graphs at each W8A8 layer", OPS_UNAVAILABLE)


def _define() -> None:
    # No `from __future__ import annotations` in this module: the schema is inferred from these annotations, and
    # Optional[...] rather than `X | None` because the custom-op schema inference of older torch lines reads only the
    # former (ruff's UP045 is off for this file).
    @torch.library.custom_op(f"{NAMESPACE}::w8a8_linear", mutates_args=())
    def w8a8_linear_op(
        x: Tensor,
        w: Tensor,
        w_scale: Tensor,
        bias: Optional[Tensor],
        smooth: Optional[Tensor],
        path: Optional[str],
        site: Optional[str],
        out_dtype: Optional[torch.dtype],
        convrot_group: Optional[int],
    ) -> Tensor:
        sites = (site,) if site is not None else SITES.find_all(w)  # no site: the module's weight names it (sites.py)
        site = sites[0] if sites else None
        _count(*sites)  # a weight two models share: counted for both (their bypass checks see the call)
        return w8a8_linear_impl(x, w, w_scale, bias, smooth, path, site, out_dtype, convrot_group)

    @w8a8_linear_op.register_fake
    def _(x, w, w_scale, bias, smooth, path, site, out_dtype, convrot_group):
        _fake_check(x, w.shape[1], "w8a8_linear")
        return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype or x.dtype)

    @torch.library.custom_op(f"{NAMESPACE}::float_linear", mutates_args=())
    def float_linear_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], site: Optional[str], reason: str) -> Tensor:
        sites = (site,) if site is not None else SITES.find_all(weight)
        site = sites[0] if sites else None
        _count(*sites)
        return dispatch.float_linear(x, weight, bias, site=site, reason=reason)

    @float_linear_op.register_fake
    def _(x, weight, bias, site, reason):
        _fake_check(x, weight.shape[1], "float_linear")
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.custom_op(f"{NAMESPACE}::fp8_linear", mutates_args=())
    def fp8_linear_op(
        x: Tensor, w: Tensor, w_scale: Tensor, bias: Optional[Tensor], site: Optional[str], float_only: Optional[str]
    ) -> Tensor:
        sites = (site,) if site is not None else SITES.find_all(w)
        site = sites[0] if sites else None
        _count(*sites)
        return fp8_gemm.fp8_linear(x, w, w_scale, bias, site=site, float_only=float_only)

    @fp8_linear_op.register_fake
    def _(x, w, w_scale, bias, site, float_only):
        _fake_check(x, w.shape[1], "fp8_linear")
        return x.new_empty((*x.shape[:-1], w.shape[0]))

    @torch.library.custom_op(f"{NAMESPACE}::swiglu_w8a8_pair", mutates_args=())
    def swiglu_w8a8_pair_op(
        x: Tensor,
        w1: Tensor,
        s1: Tensor,
        w3: Tensor,
        s3: Tensor,
        smooth: Optional[Tensor],
        path: Optional[str],
        site: Optional[str],
        up_site: Optional[str],
        out_dtype: Optional[torch.dtype],
        convrot_group: Optional[int],
    ) -> Tensor:
        if site is None and up_site is None:  # each projection named by its own weight
            found1, found3 = SITES.find_all(w1), SITES.find_all(w3)
            # recorded as two sites even if one is unknown (one site would be recorded as a single 2F-wide layer)
            site, up_site = (found1 or (UNNAMED,))[0], (found3 or (UNNAMED,))[0]
            _count(*found1, *found3)
        else:
            _count(site, up_site)
        return swiglu_w8a8_pair_impl(x, w1, s1, w3, s3, smooth, path, site, up_site, out_dtype, convrot_group)

    @swiglu_w8a8_pair_op.register_fake
    def _(x, w1, s1, w3, s3, smooth, path, site, up_site, out_dtype, convrot_group):
        _fake_check(x, w1.shape[1], "swiglu_w8a8_pair")
        return x.new_empty((*x.shape[:-1], w1.shape[0]), dtype=out_dtype or x.dtype)

    @torch.library.custom_op(f"{NAMESPACE}::qk_norm_rope", mutates_args=())
    def qk_norm_rope_op(x: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
        return dispatch.qk_norm_rope(x, weight, cos, sin, eps)

    @qk_norm_rope_op.register_fake
    def _(x, weight, cos, sin, eps):
        if x.dim() != 4:
            raise operands.KernelInputError(f"qk_norm_rope: x must be [B, N, H, D]; got {tuple(x.shape)}")
        return x.new_empty(x.shape)

    ops = getattr(torch.ops, NAMESPACE)
    for name in (
        "w8a8_linear",
        "float_linear",
        "fp8_linear",
        "swiglu_w8a8_pair",
        "qk_norm_rope",
    ):
        _OPS[name] = getattr(ops, name).default


def _fake_check(x, k: int, where: str) -> None:
    """What the tracer can check from shapes alone (the real implementation validates everything else)."""
    if x.dim() < 1 or x.shape[-1] != k:
        raise operands.KernelInputError(
            f"{where}: x is {tuple(x.shape)} but the weight has K={k}; x's last dim must be K"
        )


_register()


def op(name: str):
    """The registered op overload ``torch.ops.ideogram4_int8.<name>.default`` (None when unavailable)."""
    return _OPS.get(name)


# -- what module forwards call ----------------------------------------------------------------------------------


def w8a8_linear(x, w, w_scale, bias=None, smooth=None, path=None, site=None, out_dtype=None, convrot_group=None):
    """``dispatch.w8a8_linear`` (ConvRot noted in the registry): the registered op while dynamo traces, else the
    direct call."""
    if _is_compiling() and _OPS:
        return _OPS["w8a8_linear"](x, w, w_scale, bias, smooth, path, site, out_dtype, convrot_group)
    return w8a8_linear_impl(x, w, w_scale, bias, smooth, path, site, out_dtype, convrot_group)


def float_linear(x, weight, bias=None, site=None, reason="unquantized layer"):
    """``dispatch.float_linear`` (a float linear recorded as path 'bf16'): the op while dynamo traces."""
    if _is_compiling() and _OPS:
        return _OPS["float_linear"](x, weight, bias, site, reason)
    return dispatch.float_linear(x, weight, bias, site=site, reason=reason)


def fp8_linear(x, w, w_scale, bias=None, site=None, float_only=None):
    """``fp8_gemm.fp8_linear`` (an e4m3 weight on the ``triton-fp8`` path, else dequantized, labelled): the op while
    dynamo traces."""
    if _is_compiling() and _OPS:
        return _OPS["fp8_linear"](x, w, w_scale, bias, site, float_only)
    return fp8_gemm.fp8_linear(x, w, w_scale, bias, site=site, float_only=float_only)


def swiglu_w8a8_pair(
    x, w1, s1, w3, s3, smooth=None, path=None, site=None, up_site=None, out_dtype=None, convrot_group=None
):
    """``gate_up.swiglu_w8a8_pair`` with ``site`` (and ``up_site``: the two projections' own sites): the op while
    dynamo traces."""
    if _is_compiling() and _OPS:
        return _OPS["swiglu_w8a8_pair"](x, w1, s1, w3, s3, smooth, path, site, up_site, out_dtype, convrot_group)
    return swiglu_w8a8_pair_impl(x, w1, s1, w3, s3, smooth, path, site, up_site, out_dtype, convrot_group)


def qk_norm_rope(x, weight, cos, sin, eps):
    """``dispatch.qk_norm_rope`` (per-head RMSNorm + RoPE of q or k): the op while dynamo traces."""
    if _is_compiling() and _OPS:
        return _OPS["qk_norm_rope"](x, weight, cos, sin, float(eps))
    return dispatch.qk_norm_rope(x, weight, cos, sin, eps)


__all__ = [
    "NAMESPACE",
    "OPS_UNAVAILABLE",
    "OP_CALLS",
    "CONVROT_NOTE",
    "op",
    "w8a8_linear",
    "float_linear",
    "fp8_linear",
    "swiglu_w8a8_pair",
    "qk_norm_rope",
    "w8a8_linear_impl",
    "swiglu_w8a8_pair_impl",
]
