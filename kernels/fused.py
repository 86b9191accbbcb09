"""The ``triton-int8`` path: pick a tile config, then walk the backend ladder Gluon -> portable Triton.

A Gluon pick runs the Hopper kernel where this device, Triton and the operands allow it; otherwise,
or once it has failed to compile or launch for a shape, the shape runs the portable kernel with the
same tile (``configs.portable_twin``), and the config source says why. A portable kernel that fails
raises ``FusedUnavailable``: dispatch then runs the ``cublas-int8`` path and records the reason. Both
demotions are kept per shape in ``backends.DEMOTIONS``: a later call goes straight to what works.
"""

from __future__ import annotations

import contextlib

import torch

from . import capture_guard
from .backends import DEMOTIONS, unavailable
from .configs import GemmConfig, m_bucket, portable_twin
from .operands import gluon_operand_problem
from .registry import REGISTRY
from .tuning import EPILOGUE_LINEAR, EPILOGUE_PAIR, PICKER


class FusedUnavailable(RuntimeError):
    """The portable Triton kernel failed for this shape (the reason is the message)."""


def launch_config(cfg: GemmConfig, q, w, q_scale, w_scale, bias, out, raw_int32, *, up=None) -> torch.Tensor:
    """Run exactly ``cfg`` on its backend (raises where it cannot: autotuning skips such configs).

    ``up = (w3, s3)``: the SwiGLU gate/up pair from two weights (``w`` / ``w_scale`` the gate's, out [M, F])."""
    why = _gluon_problem(cfg, q, w, out, bias, up) if cfg.is_gluon else None
    if why:
        raise RuntimeError(why)
    return _launch(cfg, q, w, q_scale, w_scale, bias, out, raw_int32, up)


def _launch(cfg: GemmConfig, q, w, q_scale, w_scale, bias, out, raw_int32, up) -> torch.Tensor:
    """``cfg`` on its backend, the Gluon one already checked (``_gluon_problem``)."""
    if cfg.is_gluon:
        from . import gemm_gluon

        return gemm_gluon.launch_gemm(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, up=up)
    from . import gemm_triton

    return gemm_triton.launch_gemm(q, w, cfg, q_scale, w_scale, bias, out, raw_int32, up=up)


def _gluon_problem(cfg: GemmConfig, q, w, out, bias, up) -> str | None:
    """Why the Gluon kernel cannot run this pick here, else None: the backend's answer for this device
    (``backends.unavailable``), then the operands' (``operands.gluon_operand_problem``)."""
    return unavailable("gluon", q.device) or gluon_operand_problem(cfg, q, w, out, bias, up)


def run_fused(q, w, q_scale, w_scale, bias, out, raw_int32, *, timed=None, up=None):
    """out = the W8A8 GEMM of q [M, K] and w [N, K] on the fused path: (out, config that ran, its source).

    ``up = (w3, s3)``: the SwiGLU gate/up pair, gate w = w1 [F, K], up w3 [F, K], out [M, F]; its tuning key
    is the GEMM it computes (N = 2F, epilogue ``EPILOGUE_PAIR``).
    ``timed``: the registry path to time the launch under. Only the launch is timed, never the picker:
    its one-time autotuning runs hundreds of trial launches that are not part of the GEMM."""
    pair = up is not None
    m, k = q.shape
    n = 2 * w.shape[0] if pair else w.shape[0]
    if m == 0:
        return out, None, None

    def trial(c):
        return launch_config(c, q, w, q_scale, w_scale, bias, out, raw_int32, up=up)

    epilogue = EPILOGUE_PAIR if pair else EPILOGUE_LINEAR
    cfg, source = PICKER.pick(q, w, trial, epilogue=epilogue, n=n)
    shape = (n, k, m_bucket(m), epilogue)
    timing = REGISTRY.timed(timed, q.device) if timed else contextlib.nullcontext()
    if cfg.is_gluon:
        why = _gluon_problem(cfg, q, w, out, bias, up) or DEMOTIONS.get("gluon", shape)
        if why is None:
            try:
                with timing:
                    _launch(cfg, q, w, q_scale, w_scale, bias, out, raw_int32, up)
                return out, cfg, source
            except Exception as exc:  # noqa: BLE001 - compile/launch failure: demote this shape once
                if capture_guard.capturing(q.device):
                    raise  # the capture's failure, not the kernel's (capture_guard)
                why = DEMOTIONS.demote("gluon", shape, exc, f"Gluon kernel {cfg.key()}")
        twin = portable_twin(cfg, pair)
        cfg, source = twin, f"{source}; {why}: the portable Triton kernel ran"
    why = DEMOTIONS.get("triton", shape)
    if why:
        raise FusedUnavailable(why)
    try:
        with timing:
            _launch(cfg, q, w, q_scale, w_scale, bias, out, raw_int32, up)
    except Exception as exc:  # noqa: BLE001
        if capture_guard.capturing(q.device):
            raise  # the capture's failure, not the kernel's (capture_guard)
        raise FusedUnavailable(DEMOTIONS.demote("triton", shape, exc, f"Triton kernel {cfg.key()}")) from exc
    return out, cfg, source
