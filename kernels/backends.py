"""GEMM backends, registered from real import attempts, and the per-shape demotion record.

Backends, fastest first (the ladder inside the ``triton-int8`` path, then the next path):

* ``gluon``: the Hopper kernels of gemm_gluon.py (sm_90 only), on the Triton lines they are compiled
  for in CI and run on an H100/H200 (``GLUON_TRITON_LINES``);
* ``triton``: the portable kernels of gemm_triton.py (sm_80+; Triton >= 3.4);
* ``cublas``: ``torch._int_mm`` + epilogue (the ``cublas-int8`` path);
* ``reference``: the pure-torch twins (always).

Whether a backend can run on a device with this machine's torch and Triton is one question, ``unavailable``
(``runnable_kernels`` asks it per tile kernel); every other module asks it here. Each backend's availability
comes from importing it, once, on first use (never at package import): a Triton that is missing, too old, or
whose API changed under the pack's kernels makes that backend unavailable with the reason, never an exception in
the user's run. On a GPU family this repository has not measured, each backend's kernels also check themselves
against their twins before first use (self_check.py): a mismatch makes that backend unavailable on that device, with
the reason. Whether a kernel takes one call's operands (TMA addressing, cuBLASLt alignment) is an operand
question (operands.py). A backend that imports but fails to compile or launch for a shape is *demoted* for that
shape (``DEMOTIONS``): the call runs the next backend and every later call of that shape goes straight there; the
registry carries the reason to the panel.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading

import torch

from . import settings
from .configs import BACKEND_OF, KERNELS
from .env import capability, interpreter_mode, triton_line, triton_version, version_tuple

log = logging.getLogger(__name__)

MIN_TRITON = (3, 4)
# Triton lines the Gluon kernels are compiled for (CI) and run on an H100/H200 (GPU tests, benchmarks).
# Another line runs the portable kernel until it is checked on a GPU: Gluon's API moves between releases.
GLUON_TRITON_LINES = ("3.6",)


@functools.lru_cache(maxsize=1)
def triton_import_error() -> str | None:
    """None when the portable Triton kernels import on this machine's Triton, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (Linux CUDA builds of torch bring it; Windows needs triton-windows)"
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure means: no Triton backend
        return f"Triton does not import: {type(exc).__name__}: {_summary(exc)}"
    version = getattr(triton, "__version__", "?")
    if version_tuple(version) < MIN_TRITON:
        return f"Triton {version} is older than 3.4, the oldest the pack's kernels support (torch >= 2.8 brings it)"
    try:
        from . import gemm_triton, qk_norm_rope_triton, quant_triton, rms_modulate_triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"the pack's Triton kernels do not import on Triton {version}: {type(exc).__name__}: {_summary(exc)}"
    return None


@functools.lru_cache(maxsize=1)
def gluon_import_error() -> str | None:
    """None when the Hopper Gluon kernels may run on this machine's Triton, else why not (device aside)."""
    why = triton_import_error()
    if why:
        return why
    import triton

    line = triton_line()
    if line not in GLUON_TRITON_LINES:
        return (
            f"the Hopper Gluon kernels are checked on Triton {', '.join(GLUON_TRITON_LINES)} only and this is "
            f"Triton {triton.__version__}: the portable Triton kernel runs instead"
        )
    try:
        from . import gemm_gluon
    except Exception as exc:  # noqa: BLE001
        return f"the Gluon kernels do not import on Triton {triton.__version__}: {type(exc).__name__}: {exc}"
    return gemm_gluon.IMPORT_ERROR


BACKENDS = ("gluon", "triton", "cublas", "reference")  # fastest first

# The first-use self-check (kernels/self_check.py) registers itself here when kernels/__init__.py imports it: a hook,
# not an import, since the check runs the configs the tuning picks among the backends this module says can run.
_FIRST_USE_CHECK = None


def set_first_use_check(check) -> None:
    """``check.verdict(backend, device)``: why ``backend`` failed its check on ``device`` (None: passed or not
    checked); ``check.results(device)``: what the checks found, for the report."""
    global _FIRST_USE_CHECK
    _FIRST_USE_CHECK = check


def _verdict(backend: str, device: torch.device) -> str | None:
    return _FIRST_USE_CHECK.verdict(backend, device) if _FIRST_USE_CHECK is not None else None


def unavailable(backend: str, device: torch.device) -> str | None:
    """None when ``backend`` (one of ``BACKENDS``) can run on ``device`` with this machine's torch and Triton;
    else why not, in words for the panel. Asked on every GEMM call: the Gluon answer is cached per switch."""
    if backend == "triton":
        return _triton_unavailable(device) or _verdict("triton", device)
    if backend == "gluon":
        why = _gluon_unavailable(device, settings.gluon(), interpreter_mode())
        return why or _verdict("gluon", device)
    if backend == "cublas":
        return _cublas_unavailable(device) or _verdict("cublas", device)
    if backend == "reference":
        return None
    raise ValueError(f"backend {backend!r}: expected one of {BACKENDS}")


def runnable_kernels(device: torch.device) -> tuple[str, ...]:
    """The tile kernels (``configs.KERNELS``) whose backend runs on ``device``; ``triton-tma`` needs TMA descriptors
    (Hopper and newer). Autotuning times only these."""
    cc = capability(device) if device.type == "cuda" else None
    return tuple(
        k
        for k in KERNELS
        if unavailable(BACKEND_OF[k], device) is None and (k != "triton-tma" or (cc is not None and cc >= (9, 0)))
    )


def _triton_unavailable(device: torch.device) -> str | None:
    why = triton_import_error()
    if why:
        return why
    if device.type == "cuda":
        if interpreter_mode():
            return "TRITON_INTERPRET=1 is set: Triton runs on the CPU interpreter only"
        cc = capability(device)
        if cc is not None and cc < (8, 0):
            return f"GPU is sm_{cc[0]}{cc[1]}: Triton's int8 tensor-core dot needs sm_80+ (Ampere or newer)"
        return None
    if device.type == "cpu" and interpreter_mode():
        return None
    return no_cuda_reason(device.type)


def no_cuda_reason(device_type: str) -> str:
    """Why the fused kernels do not run on tensors of ``device_type`` (not CUDA): one wording for the GEMM paths'
    reasons and the other kernels' notes, which the status report names once per device."""
    return (
        f"{'CPU' if device_type == 'cpu' else device_type} tensors: the fused Triton kernel needs a CUDA GPU (sm_80+)"
    )


@functools.lru_cache(maxsize=64)
def _gluon_unavailable(device: torch.device, allowed: bool, interpreting: bool) -> str | None:
    if not allowed:
        return f"{settings.GLUON} is off"
    if device.type != "cuda" or interpreting:
        return "the Gluon kernels need a CUDA device (sm_90)"
    why = _triton_unavailable(device) or gluon_import_error()
    if why:
        return why
    cc = capability(device)
    if cc != (9, 0):
        return f"the Gluon kernels need sm_90 (Hopper); this GPU is sm_{cc[0]}{cc[1]}"
    return None


def _cublas_unavailable(device: torch.device) -> str | None:
    if not hasattr(torch, "_int_mm"):
        return "this torch has no torch._int_mm"
    if device.type not in ("cuda", "cpu"):
        return f"torch._int_mm does not run on {device.type}"
    return None


# -- demotion --------------------------------------------------------------------------------------


class Demotions:
    """(backend, shape key) -> why that backend failed for that shape. Thread-safe; read on every call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._why: dict[tuple[str, tuple], str] = {}

    def get(self, backend: str, shape: tuple) -> str | None:
        return self._why.get((backend, shape))

    def demote(self, backend: str, shape: tuple, exc: BaseException, what: str) -> str:
        why = f"{what} failed ({type(exc).__name__}: {_summary(exc)})"
        with self._lock:
            first = (backend, shape) not in self._why
            self._why[(backend, shape)] = why
        if first:
            log.warning("Ideogram4 INT8: %s; shape %s demoted from the %s backend", why, shape, backend)
        return why

    def items(self) -> list[dict]:
        with self._lock:
            return [{"backend": b, "shape": list(s), "reason": r} for (b, s), r in self._why.items()]

    def clear(self) -> None:
        with self._lock:
            self._why.clear()


DEMOTIONS = Demotions()


def _summary(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    line = next((t.strip() for t in reversed(text) if t.strip()), "") if text else ""
    return line[:limit]


def report() -> dict:
    """What each backend is on this machine (for `info`, the panel and the benchmarks)."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return {
        "triton": triton_version(),
        "gluon": unavailable("gluon", device) or "available",
        "triton_kernels": unavailable("triton", device) or "available",
        "cublas_int8": unavailable("cublas", device) or "available",
        "demoted": DEMOTIONS.items(),
        "self_check": _FIRST_USE_CHECK.results(device) if _FIRST_USE_CHECK is not None else {},
    }
