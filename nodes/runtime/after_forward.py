"""``after_forward``: a check that must run after a model's forward (``op_coverage``) still runs in a compiled graph.

It computes nothing. Eager, it calls the callbacks registered with ``on_after_forward`` with (key, flag) and returns
``out`` itself. While dynamo traces it emits the custom op ``torch.ops.ideogram4_int8.after_forward``, whose real
implementation calls the same callbacks at run time and returns a copy of ``out`` (an op's output may not alias its
input; the copy of a model's output latent is ~2 MB at 1024 px): taking the forward's output as input orders it after
every layer. Under CUDA-graph replay no Python runs: the check sees the captured run only. Where this torch cannot
register custom ops (``kernels.ops.OPS_UNAVAILABLE``), the callbacks run directly under compile too (a graph break).

ComfyUI-free (torch only), so CPU tests exercise it without a ComfyUI checkout.
"""

import logging

import torch
from torch import Tensor

from ...kernels import ops as kernel_ops

# No `from __future__ import annotations`: the op's schema is inferred from its annotations (as in kernels/ops.py).

log = logging.getLogger(__name__)
_CALLBACKS: list = []  # (key: str, flag: bool) -> None, run by every after_forward


def on_after_forward(fn) -> None:
    """Register ``fn(key, flag)`` to be called by every run of ``after_forward`` (once per function)."""
    if fn not in _CALLBACKS:
        _CALLBACKS.append(fn)


def _run(key: str, flag: bool) -> None:
    for fn in list(_CALLBACKS):
        fn(key, flag)


def _register():
    if kernel_ops.OPS_UNAVAILABLE is not None:
        return None
    try:
        return _define()
    except Exception as exc:  # noqa: BLE001 - never fail the import for compile support: eager still runs
        log.warning(
            "Ideogram4 INT8: registering after_forward failed (%s: %s); a graph break instead", type(exc).__name__, exc
        )
        return None


def _define():
    @torch.library.custom_op(f"{kernel_ops.NAMESPACE}::after_forward", mutates_args=())
    def after_forward_op(out: Tensor, key: str, flag: bool) -> Tensor:
        _run(key, flag)
        return out.clone()

    @after_forward_op.register_fake
    def _(out, key, flag):
        return torch.empty_like(out)

    return getattr(torch.ops, kernel_ops.NAMESPACE).after_forward.default


_OP = _register()


def op():
    """The registered op overload ``torch.ops.ideogram4_int8.after_forward.default`` (None when unavailable)."""
    return _OP


def after_forward(out, key: str, flag: bool = False):
    """Run the ``on_after_forward`` callbacks with (key, flag) after ``out`` is computed: while dynamo traces, the op
    (its copy of ``out`` is returned); else the callbacks now (``out`` itself is returned)."""
    if _OP is not None and torch.compiler.is_compiling():
        return _OP(out, key, flag)
    _run(key, flag)
    return out


__all__ = ["after_forward", "on_after_forward", "op"]
