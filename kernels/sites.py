"""Which call site a weight tensor belongs to, looked up at run time inside the registered ops.

Under ``torch.compile`` every string a module passes to an op is a constant of the traced graph, and dynamo guards on
it. A model's blocks share one forward: with a per-layer call site among the op's arguments, each block would fail
the previous block's guard and recompile — 34 blocks per branch where ComfyUI compiles blocks one by one (KJNodes'
"transformer blocks only"), or wherever the whole-model graph breaks, far past dynamo's recompile limit. So a
module whose weight is resident passes no site while dynamo traces, and the op's real implementation asks this book
for the site of the weight tensor it received: a dict lookup by storage address, checked against the tracked tensor
itself (alive, same address, same shape), so a freed weight whose memory was reused is never taken for another.

Modules are tracked weakly with a function naming their identifying tensors; the table is rebuilt from them when a
tensor is not found (a model loaded, moved or re-quantized since), at most once per second for an address that
stays unknown (a weight cast per call in lowvram mode is passed with its site by its module instead).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable

import torch

RETRY_S = 1.0  # an address still unknown after a rebuild triggers the next rebuild only this much later


def _key(t: torch.Tensor) -> tuple:
    return t.device.type, t.device.index, t.data_ptr()


class SiteBook:
    def __init__(self) -> None:
        self._owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> tensors(module)
        self._table: dict[tuple, tuple[weakref.ref, str]] = {}
        self._unknown: dict[tuple, float] = {}  # address -> when a rebuild last failed to find it
        self._lock = threading.Lock()
        self.rebuilds = 0

    def track(self, owner, tensors: Callable[[object], Iterable[torch.Tensor]]) -> None:
        """Look ``owner.site`` up by the tensors ``tensors(owner)`` names (read again at every rebuild)."""
        with self._lock:
            self._owners[owner] = tensors
            self._table = {}  # relabelled or new: the next lookup rebuilds
            self._unknown.clear()

    def find(self, t: torch.Tensor) -> str | None:
        """The call site whose tracked tensor ``t`` is (the first, if several share it), or None."""
        sites = self.find_all(t)
        return sites[0] if sites else None

    def find_all(self, t: torch.Tensor) -> tuple[str, ...]:
        """Every call site whose tracked tensor ``t`` is: more than one where models share a weight (the Patch node
        takes a MODEL's int8 layers as they are), empty when none."""
        key = _key(t)
        sites = self._match(key, t)
        if sites:
            return sites
        with self._lock:
            failed = self._unknown.get(key)
            if failed is not None and time.monotonic() - failed < RETRY_S:
                return ()
            self._rebuild()
            sites = self._match(key, t)
            if not sites:
                if len(self._unknown) > 4096:
                    self._unknown.clear()
                self._unknown[key] = time.monotonic()
            return sites

    def _match(self, key: tuple, t: torch.Tensor) -> tuple[str, ...]:
        hit = self._table.get(key)
        if hit is None:
            return ()
        ref, sites = hit
        mine = ref()
        if mine is None or mine.data_ptr() != key[2] or mine.shape != t.shape:
            return ()
        return sites

    def _rebuild(self) -> None:
        table: dict[tuple, tuple[weakref.ref, tuple[str, ...]]] = {}
        for owner, tensors in list(self._owners.items()):
            site = getattr(owner, "site", None)
            if site is None:
                continue
            for t in tensors(owner):
                if isinstance(t, torch.Tensor) and t.data_ptr():
                    key = _key(t)
                    known = table.get(key)
                    if known is not None and known[0]() is t and site not in known[1]:
                        table[key] = (known[0], (*known[1], site))
                    elif known is None:
                        table[key] = (weakref.ref(t), (site,))
        self._table = table
        self.rebuilds += 1


SITES = SiteBook()

__all__ = ["SITES", "SiteBook"]
