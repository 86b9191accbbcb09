"""Facts about the machine the kernels run on. Nothing here initialises CUDA at import."""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib

import torch

from . import settings


@functools.lru_cache(maxsize=1)
def triton_version() -> str | None:
    """The installed Triton's version, or None (not installed, or it does not import)."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton
    except Exception:  # noqa: BLE001 - backends.triton_import_error says why
        return None
    return getattr(triton, "__version__", None)


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version string; (0, 0) when it does not parse."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def triton_line() -> str:
    """The installed Triton's release line ("3.6"), or "none"."""
    v = triton_version()
    return ".".join(map(str, version_tuple(v))) if v else "none"


def cache_dir() -> pathlib.Path:
    """The pack's cache folder (autotune picks, the CPU GEMM answer, the self-check's passes): IDEOGRAM4_INT8_CACHE_DIR,
    else $XDG_CACHE_HOME (~/.cache)/comfyui_ideogram4_int8."""
    base = settings.cache_dir() or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "comfyui_ideogram4_int8"
    )
    return pathlib.Path(base)


def interpreter_mode() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1): tests only."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def capability(device: torch.device | None = None) -> tuple[int, int] | None:
    if device is not None and device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    return _cuda_facts(_index(device))[0]


def gpu_name(device: torch.device | None = None) -> str:
    if device is not None and device.type != "cuda":
        return device.type
    return _cuda_facts(_index(device))[1]


def _index(device: torch.device | None) -> int:
    if device is None or device.index is None:
        return torch.cuda.current_device()
    return device.index


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (persistent grids size themselves by it)."""
    return _sm_count(_index(device))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _cuda_facts(index: int) -> tuple[tuple[int, int], str]:
    # cached: these are asked on every GEMM call, and the answer never changes
    return torch.cuda.get_device_capability(index), torch.cuda.get_device_name(index)


def arch_name(cc: tuple[int, int] | None) -> str:
    """The config-space family of a compute capability: GPUs that share a shared-memory size per block and an MMA
    instruction set share a family (configs.CONFIG_SPACES, configs.SMEM_LIMIT, configs.FP8_TILES).

    sm_80 (A100); sm_86 / sm_87 (RTX 30xx, A40, Orin); sm_89 (RTX 40xx, L40); sm_90 (H100, H200); sm_100 (datacenter
    Blackwell: B200 10.0, B300 10.3; tcgen05 tensor cores, 227 KB per block); sm_120 (consumer Blackwell: RTX 50
    12.0, GB10 12.1; mma.sync tensor cores, ~99 KB per block). Any other capability is named as it is ("sm75",
    "sm110"): the portable defaults serve it, pruned by the device's own shared-memory limit."""
    if cc is None:
        return "cpu"
    major, minor = cc
    if major == 8 and minor == 0:
        return "sm80"
    if major == 8 and minor in (6, 7):
        return "sm86"
    if major == 8 and minor == 9:
        return "sm89"
    if major == 9:
        return "sm90"
    if major == 10:
        return "sm100"
    if major == 12:
        return "sm120"
    return f"sm{major}{minor}"


def environment_report() -> dict:
    """GPU name / capability, torch and triton versions (used by the panel and the benchmarks)."""
    report = {
        "torch": torch.__version__,
        "triton": triton_version(),
        "cuda_available": torch.cuda.is_available(),
        "gpu": None,
        "compute_capability": None,
        "arch": "cpu",
    }
    if torch.cuda.is_available():
        cc = torch.cuda.get_device_capability()
        report.update(
            gpu=torch.cuda.get_device_name(),
            compute_capability=f"{cc[0]}.{cc[1]}",
            arch=arch_name(cc),
        )
    return report
