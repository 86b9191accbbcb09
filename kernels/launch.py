"""Launch compiled Triton kernels without re-binding every argument on each call.

``kernel[grid](*args)`` binds and specializes every argument and rebuilds its cache key on each call;
a W8A8 linear launches two kernels, and at Ideogram 4's sizes the host then falls behind the GPU: a step's
launches take longer than its GPU work (docs/design/measurements.md). ``Launcher`` keeps
the ``CompiledKernel`` that ``kernel[grid]`` returned per argument signature and launches it again
through ``CompiledKernel[grid](*args)`` (the same launch: launch hooks and profilers still see it).

Guards: only on the Triton lines where this runs in the GPU tests (``FAST_LAUNCH_LINES``), only
when the compiled kernel has the ``[grid]`` launcher, and any exception on that path turns the cache off
for the process and relaunches through ``kernel[grid]``. The experiment ``no-fast-launch`` turns it off.

The signature key is conservative: exact values for every scalar (Triton specializes integers on == 1 and
% 16, and constexprs on their value), dtype and 16-byte alignment for tensors, and dtype, alignment,
shape, strides, block shape and layout for TMA descriptors. A miss goes through ``kernel[grid]``.

Inside a CUDA graph capture a miss may only reach a variant (``_variant``: what Triton compiles apart, at least)
that this process launched before: a new one would compile and load its module there, which a capture refuses and
which can leave Triton's kernel half set up. It raises ``capture_guard.FirstUseInCapture`` instead, so the capture
fails and the pass runs eagerly first.
"""

from __future__ import annotations

import functools
import logging

import torch

from . import capture_guard, settings
from .env import triton_line

log = logging.getLogger(__name__)

EXPERIMENT = "no-fast-launch"
FAST_LAUNCH_LINES = ("3.6",)
_MAX_ENTRIES = 512  # signatures per kernel (token counts vary with resolution and batch)
_SCALARS = (bool, int, float, str, type(None))


def _int_class(v: int) -> tuple:
    return (v == 1, v % 16 == 0, -(2**31) <= v < 2**31)  # Triton's integer specializations and its i32 / i64 type


def _variant(a):
    """What of argument ``a`` Triton compiles a kernel variant apart for, at least (a finer key is safe)."""
    t = type(a)
    if t is int:
        return ("int", *_int_class(a))
    if t is float:
        return "float"
    if t in _SCALARS:
        return a
    if isinstance(a, torch.Tensor):
        return (a.dtype, not a.data_ptr() & 15)
    base = getattr(a, "base", None)
    if isinstance(base, torch.Tensor):
        return (
            base.dtype,
            not base.data_ptr() & 15,
            tuple(_int_class(int(v)) for v in a.shape),
            tuple(_int_class(int(v)) for v in a.strides),
            tuple(a.block_shape),
            getattr(a, "layout", None),
        )
    return _by_value(a)


def _by_value(a):
    """``a`` itself as a key where it hashes, else its identity (never seen again: a capture refuses it)."""
    try:
        hash(a)
    except TypeError:
        return (type(a).__name__, id(a))
    return a


def _device_of(args: tuple):
    """The device of the first tensor (or descriptor's tensor) among ``args``, or None."""
    for a in args:
        t = a if isinstance(a, torch.Tensor) else getattr(a, "base", None)
        if isinstance(t, torch.Tensor):
            return t.device
    return None


def _arg_key(a):
    t = type(a)
    if t in _SCALARS:
        return a
    if isinstance(a, torch.Tensor):
        return (a.dtype, not a.data_ptr() & 15)
    base = getattr(a, "base", None)
    if isinstance(base, torch.Tensor):  # a host TensorDescriptor (Triton's, or Gluon's with its smem layout)
        return (
            base.dtype,
            not base.data_ptr() & 15,
            tuple(a.shape),
            tuple(a.strides),
            tuple(a.block_shape),
            getattr(a, "layout", None),
        )
    return a


class Launcher:
    """``Launcher(jit_fn)(grid, args, kwargs)``: ``args`` positional in signature order, ``kwargs`` the
    remaining parameters by name and the launch options (num_warps, num_stages, maxnreg)."""

    def __init__(self, jit_fn) -> None:
        self.fn = jit_fn
        self._names = tuple(getattr(jit_fn, "arg_names", ()))
        self._compiled: dict = {}
        self._variants: set = set()  # the variants launched in this process (module docstring)
        # constexpr parameters count by value (Triton compiles each value apart); all of them where it cannot say
        params = getattr(jit_fn, "params", None)
        self._exact = tuple(getattr(p, "is_constexpr", True) for p in params) if params else None
        self.cached_launches = 0  # tests read this to prove the cached path ran

    def __call__(self, grid, args: tuple, kwargs: dict):
        key = self._key(args, kwargs) if _enabled() else None
        compiled = self._compiled.get(key) if key is not None else None
        if compiled is not None:
            try:
                params = args + tuple(kwargs[n] for n in self._names[len(args) :])
                compiled[tuple(grid) + (1,) * (3 - len(grid))](*params)
                self.cached_launches += 1
                return compiled
            except Exception as exc:  # noqa: BLE001 - never fail a launch for the shortcut: turn it off
                _disable(f"{type(exc).__name__}: {exc}")
        variant = self._variant_of(args, kwargs)
        if variant not in self._variants and capture_guard.capturing(torch.device("cuda")):
            name = getattr(self.fn, "__name__", "a Triton kernel")
            capture_guard.refuse_first_use(torch.device("cuda"), f"loading {name} for new argument classes")
        compiled = self.fn[grid](*args, **kwargs)
        if len(self._variants) >= _MAX_ENTRIES:  # forgetting is safe: a capture then refuses, the pass runs eagerly
            self._variants.clear()
        self._variants.add(variant)
        if key is not None and callable(getattr(compiled, "__getitem__", None)):
            if len(self._compiled) >= _MAX_ENTRIES:
                self._compiled.clear()
            self._compiled[key] = compiled
        return compiled

    def _variant_of(self, args, kwargs) -> tuple:
        exact = self._exact
        by_class = (exact is not None and i < len(exact) and not exact[i] for i in range(len(args)))
        return (
            _device_of(args),  # each device loads its own modules
            *kwargs.items(),
            *(_variant(a) if c else _by_value(a) for a, c in zip(args, by_class, strict=True)),
        )

    def _key(self, args, kwargs):
        if any(n not in kwargs for n in self._names[len(args) :]):
            return None  # a parameter left to its default: no shortcut
        return (*kwargs.items(), *map(_arg_key, args))


@functools.lru_cache(maxsize=1)
def fast_launch_unavailable() -> str | None:
    """None when compiled kernels may be relaunched through ``CompiledKernel[grid]`` (launch.py), else why not."""
    line = triton_line()
    if line not in FAST_LAUNCH_LINES:
        return f"cached launches are checked on Triton {', '.join(FAST_LAUNCH_LINES)} only; this is Triton {line}"
    try:
        from triton.compiler import CompiledKernel
    except ImportError as exc:
        return f"triton.compiler.CompiledKernel is not importable: {exc}"
    if not callable(getattr(CompiledKernel, "__getitem__", None)):
        return "this Triton's CompiledKernel has no [grid] launcher"
    return None


_STATE = {"disabled": None}


def _enabled() -> bool:
    if _STATE["disabled"] is not None or settings.flag(EXPERIMENT):
        return False
    why = fast_launch_unavailable()
    if why:
        _STATE["disabled"] = why
        return False
    return True


def _disable(why: str) -> None:
    if _STATE["disabled"] is None:
        _STATE["disabled"] = why
        log.warning("Ideogram4 INT8: cached kernel launches turned off (%s); kernel[grid] launches instead", why)


_LAUNCHERS: dict = {}


def launch(kernel, grid, args: tuple, kwargs: dict):
    """Launch ``kernel`` (a @triton.jit / @gluon.jit function) through its process-wide ``Launcher``."""
    launcher = _LAUNCHERS.get(kernel)
    if launcher is None:
        launcher = _LAUNCHERS[kernel] = Launcher(kernel)
    return launcher(grid, args, kwargs)


def status() -> str:
    """'on' or why the cached launch path is off (for `info` and the benchmarks)."""
    if settings.flag(EXPERIMENT):
        return f"off ({settings.said(EXPERIMENT)})"
    return "on" if _enabled() else f"off ({_STATE['disabled']})"
