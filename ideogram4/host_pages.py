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

import torch

MAPS = "/proc/self/maps"


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


def own_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied into fresh, contiguous host memory."""
    out = torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


__all__ = ["FileMappings", "own_copy", "MAPS"]
