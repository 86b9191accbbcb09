"""The Gluon (Hopper) API names the Gluon GEMM modules use, bound once for every Triton line.

Gluon ships with triton >= 3.5 and renamed a few of its names between releases: this module imports it
where it can and binds the moved names (``_tma_load``, ``_tma_store``, ``_warp_specialize``). ``IMPORT_ERROR``
is None where Gluon imports, else why not; modules that define Gluon code (gemm_gluon_device.py,
gemm_gluon_kernel.py) do so only under ``if IMPORT_ERROR is None:``. Which Triton lines may run the Gluon
kernels is decided in ``backends.py``.
"""

try:  # Gluon ships with triton >= 3.5; the pack must import without it.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # renamed in later Triton releases: the old name where it still exists
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _warp_specialize = gl.warp_specialize
    IMPORT_ERROR = None
except Exception as exc:  # pragma: no cover - depends on the installed triton
    IMPORT_ERROR = f"triton.experimental.gluon (Hopper) is not importable: {type(exc).__name__}: {exc}"

# the names the Gluon modules import from here (bound only where IMPORT_ERROR is None)
__all__ = [
    "IMPORT_ERROR",
    "TensorDescriptor",
    "_tma_load",
    "_tma_store",
    "_warp_specialize",
    "fence_async_shared",
    "gl",
    "gluon",
    "mbarrier",
    "tma",
    "warpgroup_mma",
    "warpgroup_mma_wait",
]
