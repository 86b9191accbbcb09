"""The card as the runs read it: peak memory, an emulated smaller card, the host-to-device bandwidth."""

from __future__ import annotations

import time

import torch

GIB = 1024**3


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / GIB, 2) if torch.cuda.is_available() else None


def peaks_per_card() -> dict[str, float] | None:
    """Peak allocated GiB of every card (a two-GPU peer holds one branch on each)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    return {f"cuda:{i}": round(torch.cuda.max_memory_allocated(i) / GIB, 2) for i in range(torch.cuda.device_count())}


def reset_peaks() -> None:
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)


def take_all_but(cap: float):
    """Hold everything above a ``cap``-GiB card (this process's CUDA context counted in) as one allocation."""
    if not cap:
        return None
    free, total = torch.cuda.mem_get_info()
    context = total - free  # this process's context (and whatever else holds the GPU now)
    extra = int(free - (cap * GIB - context))
    if extra <= 0:
        raise RuntimeError(f"the GPU has {free / GIB:.1f} GiB free: cannot emulate a {cap:g} GiB card")
    return torch.empty(extra, dtype=torch.uint8, device="cuda")


def bandwidth() -> dict:
    """Host→device GiB/s from pinned and pageable memory (1 GiB, 4 copies each), before anything else runs."""
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    out["triton"] = triton.__version__
    for pinned in (True, False):
        h = torch.empty(GIB, dtype=torch.uint8, pin_memory=pinned)
        d = torch.empty_like(h, device="cuda")
        d.copy_(h)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(4):
            d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        out["pinned_gib_s" if pinned else "pageable_gib_s"] = round(4 / (time.perf_counter() - t), 1)
        del h, d
    torch.cuda.empty_cache()
    return out
