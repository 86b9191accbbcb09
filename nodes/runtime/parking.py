"""A pack MODEL unloaded whole comes back without pushing ComfyUI's dynamic-VRAM models off the card whole.

At a prompt change the text encoder (a dynamic-VRAM model in ComfyUI 0.33) needs the card and the pack's MODELs are
unloaded whole, which drops their card copies (``host_copies``). At the next run ComfyUI's ``load_models_gpu`` asks
room for every byte of both branches (x1.1 plus its reserve), more than a 16 GB card has, so ``free_memory``
detaches the text encoder, and a detached dynamic model drops its pinned host memory
(``ModelPatcherDynamic.unpatch_model``): the next encode reads and pins it all again, where native ComfyUI, whose
models are all dynamic, keeps it (docs/performance.md, "A prompt change at 16 GB").

A MODEL unloaded whole with its host copies is *parked*: it records the bytes it held on the card, ComfyUI counts
it as loaded (``current_loaded_device``, ``loaded_size``: nothing to free for it), and its next load reclaims those
bytes itself, first from the dynamic models' pages (their ``partially_unload``, the call ComfyUI makes on a dynamic
model for another: the pages go, the pins stay, their next use faults them back), then, still short, through
ComfyUI's ``free_memory`` of the other non-dynamic models only (what is still missing streams). A dynamic model is
never unloaded whole for it: that would drop its pins. A MODEL about to load for the first time in the pack's
sampler is parked with all its bytes (``park_fresh``), so the first prompt keeps the encoder's pins too. The
experiment ``park=off`` turns it off (A/B).
"""

from __future__ import annotations

import comfy.model_management as mm
import torch

from ...kernels import settings
from .budget import unlimited

EXPERIMENT = "park"
MARGIN = 64 * 2**20  # bytes per MODEL reclaimed beyond what it held (its plan is made again from the budget)


def enabled() -> bool:
    return settings.experiment(EXPERIMENT) != "off"


def park(patcher, card_bytes: int) -> None:
    """``patcher``'s MODEL was unloaded whole from ``card_bytes`` on the card, its host copies back in place."""
    if enabled() and card_bytes > 0:
        patcher.model.ideogram4_parked = int(card_bytes)


def park_fresh(patcher) -> bool:
    """``patcher``'s MODEL, if not on the card yet, is parked with all its bytes: its first load makes its room as a
    parked one's does. ComfyUI's own request for every byte of both branches detached the text encoder that had just
    run, so the second prompt's encode read and pinned it all again. Returns whether it parked it."""
    if patcher.model.model_loaded_weight_memory <= 0 and not parked_bytes(patcher):
        park(patcher, patcher.model_size())
        return bool(parked_bytes(patcher))
    return False


def parked_bytes(patcher) -> int:
    """The card bytes a parked MODEL will reclaim at its next load (0: not parked)."""
    return getattr(patcher.model, "ideogram4_parked", 0) if enabled() else 0


def unpark(patcher) -> None:
    patcher.model.ideogram4_parked = 0


def _dynamic_on(device: torch.device):
    for loaded in list(mm.current_loaded_models):
        model = loaded.model
        if model is not None and model.is_dynamic() and torch.device(loaded.device) == device:
            yield model


def reclaim(device, offered: float, want: int, keep) -> float:
    """The budget for a parked load on ``device``: ``offered`` (ComfyUI's offer, which counted the parked MODEL as
    loaded; ``budget.unlimited``: no limit) plus what freeing the room short of ``want`` bytes gave;
    ``keep(loaded_model)`` names ComfyUI's entries that must stay (the pack's MODELs of this load or of a run)."""
    device = torch.device(device)
    if device.type == "cpu":
        return max(offered, 0)
    # a negative offer is ComfyUI's minimum free memory not met yet: that much more must be freed first
    short = want - min(offered, mm.get_free_memory(device))
    if short <= 0:
        return max(offered, 0)
    freed = 0
    for model in _dynamic_on(device):
        if freed >= short:
            break
        freed += model.partially_unload(model.offload_device, short - freed)
    others = [m for m in mm.current_loaded_models if not keep(m) and m.model is not None and not m.model.is_dynamic()]
    if freed < short and any(torch.device(m.device) == device for m in others):
        before = mm.get_free_memory(device)
        kept = [m for m in mm.current_loaded_models if m not in others]  # a dynamic model never whole
        mm.free_memory(before + short - freed, device, keep_loaded=kept)
        freed += max(mm.get_free_memory(device) - before, 0)
    return offered if unlimited(offered) else max(offered + freed, 0)


__all__ = ["EXPERIMENT", "MARGIN", "enabled", "park", "park_fresh", "parked_bytes", "reclaim", "unpark"]
