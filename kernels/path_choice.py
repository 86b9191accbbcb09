"""Which GEMM path a W8A8 call takes (``select_path``), and the float dtype of the dequantized path.

Paths, fastest first:
  triton-int8   fused Triton GEMM (int8 tensor cores, dequant + bias in the epilogue)  CUDA sm_80+
  cublas-int8   torch._int_mm (cuBLASLt on CUDA) + epilogue                            CUDA, CPU with fast int8
  dequant-bf16  the 'phantom INT8' path: dequantize, float matmul                      anywhere
On a CPU, cublas-int8 runs only where torch._int_mm measured faster than the dequantized float matmul (``cpu_gemm``:
without VNNI/AMX it is far slower; docs/performance.md, "CPU"); there the dequantized matmul runs in float32 (or
bf16 where that measured faster: ``dequant_dtype``). The path is picked per call from the device, dtype and shape;
it can be forced with the ``path`` argument (strict: raises GemmPathUnavailable if impossible) or the
IDEOGRAM4_INT8_GEMM_PATH switch (``settings``; lenient: falls back, and the reason says so). A fused kernel that
fails for a shape falls back by the same rules (``select_after_fused_failure``). The entry points that run the
chosen path and record it are in dispatch.py and gate_up.py.
"""

from __future__ import annotations

import functools
import os

import torch

from . import cpu_gemm, self_check, settings
from .backends import no_cuda_reason, unavailable
from .operands import cublas_shape_problem
from .registry import PATH_CUBLAS, PATH_DEQUANT, PATH_TRITON, path_labels

ENV_PATH = settings.GEMM_PATH
# why no quantized linear on a CPU takes the fused path: the first part of each such layer's reason (the status report
# names it once as the device's reason, so the panel need not repeat it per layer)
CPU_REASON = no_cuda_reason("cpu")


_QUANT_PATHS = (PATH_TRITON, PATH_CUBLAS, PATH_DEQUANT)
# the backend that answers whether a path can run on a device (backends.unavailable): the fused path's first
# rung is the portable Triton kernel (a Gluon pick falls back to it inside the path, fused.py)
BACKEND_OF_PATH = {PATH_TRITON: "triton", PATH_CUBLAS: "cublas", PATH_DEQUANT: "reference"}


class GemmPathUnavailable(ValueError):
    """A path was forced through the ``path`` argument but cannot run here."""


def _unavailable(path: str, device: torch.device, n: int, k: int) -> str | None:
    """Why ``path`` cannot run an [n, k] weight on ``device``: its backend's answer, then cuBLASLt's alignment."""
    why = unavailable(BACKEND_OF_PATH[path], device)
    if why is None and path == PATH_CUBLAS:
        why = cublas_shape_problem(device, n, k)
    return why


def select_path(device: torch.device, n: int, k: int, path: str | None = None) -> tuple[str, str]:
    """(path, reason). ``reason`` says why a faster path was not taken ('' when fastest ran)."""
    # asked on every GEMM call: cached per inputs, including the switches the answer depends on
    now = settings.current()
    forced, problem = settings.gemm_path(), now.problems.get(ENV_PATH)
    switches = (now.experiments.get("cpu-gemm"), os.environ.get("TRITON_INTERPRET", ""))
    return _select_path_cached(device, n, k, path, forced, problem, switches)


@functools.lru_cache(maxsize=4096)
def _select_path_cached(device, n, k, path, forced, problem, _switches) -> tuple[str, str]:
    if path is not None:
        if path not in _QUANT_PATHS:
            raise GemmPathUnavailable(f"path={path!r}: expected one of {_QUANT_PATHS}")
        why = _unavailable(path, device, n, k)
        if why:
            raise GemmPathUnavailable(f"path={path!r} cannot run here: {why}")
        return path, _forced_reason(path, "path argument")
    if forced:
        why = _unavailable(forced, device, n, k)
        if why is None:
            return forced, _forced_reason(forced, f"{ENV_PATH}={forced}")
        return _auto(device, n, k, note=f"{ENV_PATH}={forced} requested, but {why}")
    return _auto(device, n, k, note=problem or "")


self_check.on_reset(_select_path_cached.cache_clear)  # a path chosen from verdicts that are forgotten


def _forced_reason(path: str, how: str) -> str:
    return "" if path == PATH_TRITON else f"forced by {how}"


def select_after_fused_failure(device: torch.device, n: int, k: int, exc: BaseException) -> tuple[str, str]:
    """(path, reason) for a call whose fused kernel failed for this shape (``fused.FusedUnavailable``): the automatic
    choice among the slower paths, by the rules ``select_path`` uses, the reason leading with the failure."""
    return _auto(device, n, k, note=f"the fused Triton kernel failed for this shape: {exc}", after=PATH_TRITON)


def _auto(device: torch.device, n: int, k: int, note: str = "", after: str | None = None) -> tuple[str, str]:
    """The fastest path (those slower than ``after`` only) that can run here, and why the faster ones did not."""
    reasons = [note] if note else []
    start = _QUANT_PATHS.index(after) + 1 if after else 0
    for candidate in _QUANT_PATHS[start:]:
        if candidate == PATH_TRITON and device.type == "cpu":
            # The CPU interpreter is a test vehicle, never an automatic choice.
            reasons.append(CPU_REASON)
            continue
        why = _unavailable(candidate, device, n, k)
        if why is None and candidate == PATH_CUBLAS and device.type == "cpu":
            # no tensor cores: torch._int_mm is the fast CPU path only where it measured so (cpu_gemm); the reason
            # gives the measurement either way
            answer = cpu_gemm.choice()
            why = answer.why_not_int_mm()
            if why is None:
                reasons.append(f"{answer.evidence()}, so it runs")
        if why is None:
            return candidate, "; ".join(reasons)
        reasons.append(why)
    raise AssertionError("dequant-bf16 is always available")  # pragma: no cover


def dequant_dtype(x: torch.Tensor) -> torch.dtype:
    """The float dtype of the dequantized matmul: x's on a GPU; on a CPU float32 (a CPU without bf16 units runs a
    bf16 matmul several times slower), or bf16 for bf16 inputs where bf16 measured faster (cpu_gemm)."""
    if x.device.type != "cpu" or x.dtype == torch.float32:
        return x.dtype
    fast = cpu_gemm.choice().float_dtype
    return torch.bfloat16 if x.dtype == torch.bfloat16 and fast == torch.bfloat16 else torch.float32


def labels_here() -> tuple[str, dict[str, str]]:
    """(device type, {path id: what it runs there}) in the words the panel, the logs and the loader summaries share:
    the CUDA words where torch sees a GPU, else the CPU's, with the float dtype the CPU's measurement picked (float32
    until it measured; never measures)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    answer = cpu_gemm.decided()
    dtype = str(answer.float_dtype).replace("torch.", "") if answer is not None else "float32"
    return device, path_labels(device, dtype)
