"""Host tensors that lie in a private mapping of a file, and their copy in the process's own memory before pinning.

safetensors hands out a checkpoint's tensors as views of a private (copy-on-write) mapping of the whole file, so the
weights a loader gives a model are the file's pages until something writes them. Pinning registers a tensor's pages
for the GPU's DMA writable: on such a mapping every page is first copied, one by one, inside the registration call.
Copying the tensor into fresh memory first (torch's copy runs on its intra-op threads), then registering pages that
are already the process's own, does the same work in parallel (docs/performance.md, "Pinning a checkpoint's
weights"). On a platform without ``/proc/self/maps`` nothing is taken for file-mapped.
"""

from __future__ import annotations

import bisect
import mmap

import torch

MAPS = "/proc/self/maps"
HUGE_PAGE = 2 * 2**20  # bytes: a transparent huge page on x86-64 and arm64 (4 KiB base pages)


class FileMappings:
    """The private file mappings of this process when made (a snapshot: make one per batch of tensors)."""

    def __init__(self, maps_text: str | None = None) -> None:
        if maps_text is None:
            try:
                with open(MAPS, encoding="utf-8", errors="replace") as f:
                    maps_text = f.read()
            except OSError:
                maps_text = ""
        ranges = []
        for line in maps_text.splitlines():
            parts = line.split(maxsplit=5)
            # address range, permissions ("rw-p": p for private), offset, device, inode, path
            if len(parts) == 6 and parts[1].endswith("p") and parts[5].startswith("/"):
                start, end = parts[0].split("-")
                ranges.append((int(start, 16), int(end, 16)))
        ranges.sort()
        self._starts = [s for s, _ in ranges]
        self._ends = [e for _, e in ranges]

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s first byte lies in a private mapping of a file (a CPU tensor; False for any other)."""
        if t.device.type != "cpu" or t.numel() == 0:
            return False
        ptr = t.data_ptr()
        i = bisect.bisect_right(self._starts, ptr) - 1
        return i >= 0 and ptr < self._ends[i]


def huge_empty(nbytes: int) -> torch.Tensor:
    """A flat uint8 host tensor of ``nbytes`` in an anonymous mapping advised for transparent huge pages, from a
    huge-page boundary: registering it for the GPU locks a few large pages instead of many small ones. Where the
    advice is not available (not Linux), ``torch.empty``. The mapping lives as long as the tensor."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or nbytes < HUGE_PAGE:
        return torch.empty(nbytes, dtype=torch.uint8)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE)
    region.madvise(advice)
    base = torch.frombuffer(region, dtype=torch.uint8)
    pad = -base.data_ptr() % HUGE_PAGE
    return base[pad : pad + nbytes]


def own_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into fresh, contiguous host memory (``huge_empty``'s)."""
    out = huge_empty(t.nbytes).view(t.dtype).view(t.shape) if t.nbytes else torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


__all__ = ["FileMappings", "huge_empty", "own_copy", "MAPS", "HUGE_PAGE"]
