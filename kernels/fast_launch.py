"""Re-launch compiled Triton kernels without Triton's per-call argument binding.

``kernel[grid](*args)`` binds and specializes every argument and rebuilds its cache key on each
call: measured on the H100 machine's host, 25 us for the quantizer against 9 us for the same
compiled kernel's own launcher. A W8A8 linear launches two kernels, and short GEMMs (the `o`
projection is 0.2 ms) then wait on the host. ``FastLauncher`` keeps the compiled kernel of each
argument signature and calls its launcher directly.

The signature key is conservative: exact values for every scalar (Triton specializes integers
on ==1 and %16, and constexprs on their value), dtype and 16-byte alignment for tensors, and
dtype/shape/strides/block for TMA descriptors. Any miss goes through ``kernel[grid]`` (which
compiles if needed) and records the result. Launch hooks (profilers) and the CPU interpreter
always take Triton's own path; ``IDEOGRAM4_INT8_FAST_LAUNCH=0`` turns the shortcut off.
"""

from __future__ import annotations

import os

import torch
from triton import knobs
from triton.runtime import driver

ENV_FAST_LAUNCH = "IDEOGRAM4_INT8_FAST_LAUNCH"
_MAX_ENTRIES = 512  # distinct signatures per kernel (token counts vary with resolution and batch)


_SCALARS = (bool, int, float, str, type(None))
_Tensor = torch.Tensor


def _arg_key(a):
    t = type(a)
    if t in _SCALARS:
        return a
    if t is _Tensor or isinstance(a, _Tensor):
        return (a.dtype, not a.data_ptr() & 15)
    base = getattr(a, "base", None)
    if isinstance(base, _Tensor):  # a host TensorDescriptor (Triton's, or Gluon's with its smem layout)
        layout = getattr(a, "layout", None)
        return (base.dtype, not base.data_ptr() & 15, tuple(a.shape), tuple(a.strides), tuple(a.block_shape), layout)
    return a


def _active(hook) -> bool:
    """A launch hook is set: None/empty HookChain (Triton 3.5+ keeps a chain object) means none."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


class FastLauncher:
    """``FastLauncher(jit_fn)(grid, *args, **kw)``: positional ``args`` in signature order; ``kw``
    holds the remaining parameters by name (Gluon kernels take e.g. ``num_warps`` as a parameter)
    and launch options (num_warps, num_stages, maxnreg). Every parameter must be given."""

    def __init__(self, jit_fn) -> None:
        self.fn = jit_fn
        self._names = tuple(getattr(jit_fn, "arg_names", ()))
        self._compiled: dict = {}
        self.direct_launches = 0  # tests read this to prove the shortcut ran

    def __call__(self, grid, *args, **options):
        hooks_off = not _active(knobs.runtime.launch_enter_hook) and not _active(knobs.runtime.launch_exit_hook)
        enabled = hooks_off and os.environ.get(ENV_FAST_LAUNCH, "1") != "0"
        params = args
        if enabled and len(args) < len(self._names):
            try:  # the launcher wants every parameter in order; a missing one (a default) means no shortcut
                params = args + tuple(options[n] for n in self._names[len(args) :])
            except KeyError:
                enabled = False
        key = (*options.items(), *map(_arg_key, params)) if enabled else None
        kernel = self._compiled.get(key) if enabled else None
        if kernel is not None:
            g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
            stream = driver.active.get_current_stream(driver.active.get_current_device())
            kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *params)
            self.direct_launches += 1
            return kernel
        kernel = self.fn[grid](*args, **options)
        if enabled and hasattr(kernel, "packed_metadata") and getattr(kernel, "function", None) is not None:
            if len(self._compiled) >= _MAX_ENTRIES:
                self._compiled.clear()
            self._compiled[key] = kernel
        return kernel
