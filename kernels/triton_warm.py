"""Triton's once-per-process work before a model's first pass, on a background thread while its checkpoint loads.

The first launch of a Triton kernel in a process pays, before anything compiles or loads from Triton's cache:
- Triton's own version key (``triton_key``): a hash of its compiler sources and of ``libtriton``, a shared object
  of hundreds of MB read and hashed once per process;
- each JIT function's source key (``JITFunction.cache_key``): its source and every function it calls, parsed.
Both are pure functions of the installed files, cached for the process, and run mostly outside the GIL (file reads,
hashing) or in short pure-Python steps. ``start`` computes them on a daemon thread, once per process, so the
first image's first pass does not. Anything that fails here is left to the first launch, where it fails as before.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time

log = logging.getLogger(__name__)

# the kernel modules whose JIT functions a pass launches (Gluon's only where this Triton has Gluon)
KERNEL_MODULES = (
    "gemm_triton_kernels",
    "quant_triton",
    "qk_norm_rope_triton",
    "rms_modulate_triton",
    "gemm_gluon_kernel",
    "gemm_gluon_device",
)
# where ``triton_key`` lives, by Triton line
TRITON_KEY_HOMES = ("triton.runtime.cache", "triton.compiler.compiler")

_LOCK = threading.Lock()
_THREAD: threading.Thread | None = None
RESULT: dict = {}  # what the warm-up did: seconds, JIT functions keyed, anything it skipped


def _triton_key():
    for home in TRITON_KEY_HOMES:
        try:
            key = getattr(importlib.import_module(home), "triton_key", None)
        except ImportError:
            continue
        if callable(key):
            return key
    return None


def jit_functions() -> list:
    """The JIT functions of the pack's kernel modules that import on this Triton."""
    from triton.runtime.jit import JITFunction

    found, seen = [], set()
    for name in KERNEL_MODULES:
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except Exception:  # noqa: BLE001 - a module this Triton cannot import has nothing to warm
            continue
        for value in vars(module).values():
            for fn in _jit_in(value, JITFunction):
                if id(fn) not in seen:
                    seen.add(id(fn))
                    found.append(fn)
    return found


def _jit_in(value, jit_type) -> list:
    """``value`` if it is a JIT function; the JIT functions a namespace object holds (kernels grouped in a class)."""
    if isinstance(value, jit_type):
        return [value]
    if isinstance(value, type):
        return [v for v in vars(value).values() if isinstance(v, jit_type)]
    return []


def warm() -> dict:
    """Compute Triton's version key and every pack JIT function's source key now (what ``start`` runs)."""
    started = time.perf_counter()
    out: dict = {"keyed": 0, "skipped": []}
    key = _triton_key()
    if key is None:
        out["skipped"].append("triton_key: not found on this Triton line")
    else:
        try:
            key()
        except Exception as exc:  # noqa: BLE001 - left to the first launch; the source keys still help
            out["skipped"].append(f"triton_key: {type(exc).__name__}")
    out["triton_key_s"] = round(time.perf_counter() - started, 3)
    for fn in jit_functions():
        try:
            fn.cache_key  # noqa: B018 - the property computes and keeps the key
            out["keyed"] += 1
        except Exception as exc:  # noqa: BLE001 - left to the first launch
            out["skipped"].append(f"{getattr(fn, '__name__', fn)}: {type(exc).__name__}")
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out


def _run() -> None:
    try:
        RESULT.update(warm())
        log.debug("ideogram4-int8: Triton keys computed ahead of the first pass: %s", RESULT)
    except Exception as exc:  # noqa: BLE001 - a warm-up never fails a load
        RESULT["error"] = f"{type(exc).__name__}: {exc}"
        log.debug("ideogram4-int8: Triton warm-up skipped (%s)", RESULT["error"])


def start() -> threading.Thread | None:
    """Start the warm-up once per process: None when it started before, or without CUDA or Triton (no GPU pass
    will launch a Triton kernel)."""
    global _THREAD
    with _LOCK:
        if _THREAD is not None:
            return None
        import torch

        if not torch.cuda.is_available():
            return None
        try:
            import triton  # noqa: F401
        except Exception:  # noqa: BLE001 - a broken install is the backends' to report (they fall back), not a load's
            return None
        _THREAD = threading.Thread(target=_run, name="ideogram4-int8-triton-warm", daemon=True)
        _THREAD.start()
        return _THREAD


__all__ = ["KERNEL_MODULES", "RESULT", "jit_functions", "start", "warm"]
