"""ComfyUI's "no limit" in a load's memory budget.

``LoadedModel.model_load`` turns a budget of 0 (load everything) into 1e32 bytes before it calls ``partially_load``;
the pack passes the same to ask ComfyUI's own load for every module. Any budget of that order is no limit.
"""

from __future__ import annotations

NO_LIMIT = 1e32


def unlimited(budget: float) -> bool:
    """Whether ``budget`` (bytes) is ComfyUI's no-limit value rather than a number of bytes."""
    return budget >= NO_LIMIT / 100


__all__ = ["NO_LIMIT", "unlimited"]
