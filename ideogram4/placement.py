"""Which card runs the unconditional branch, and moving a pass's inputs there.

Ideogram 4 samples with two models, one pass each per step, independent until the CFG combine. With a second GPU
the unconditional model can live there and run its pass while the first card runs the conditional one: a step then
takes about the conditional pass's time, and each card holds one branch. ``place_branch`` decides from the user's
choice and the devices present; it never fails on a machine with fewer GPUs than a shared workflow asked for: the
branch stays on the main card and the note says why.

ComfyUI-free: the devices are strings ("cuda:0"); ``nodes/branch_device_nodes.py`` asks torch which exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from .errors import public_error

SAME = "same GPU"
SECOND = "second GPU"
CHOICES = (SECOND, *(f"cuda:{i}" for i in range(1, 8)))


@public_error
class BranchDeviceError(ValueError):
    """A branch-device choice that is not one of the offered ones."""


@dataclasses.dataclass(frozen=True)
class Placement:
    device: str | None  # the unconditional branch's card; None: it stays with the conditional one
    note: str


def place_branch(choice: str, main: str, devices: Sequence[str]) -> Placement:
    """Where the unconditional branch runs for ``choice``, with ``main`` the conditional branch's device and
    ``devices`` the CUDA devices present ("cuda:0", ...)."""
    if choice != SAME and choice not in CHOICES:
        raise BranchDeviceError(f"'device' is {choice!r}: choose one of {', '.join(repr(c) for c in (SAME, *CHOICES))}")
    main = str(torch.device(main))
    if choice == SAME:
        return Placement(None, f"both branches on {main}")
    if not main.startswith("cuda"):
        return Placement(None, f"both branches on {main}: a second card needs CUDA GPUs ('{choice}' does nothing)")
    others = [d for d in devices if d != main]
    if choice == SECOND:
        if not others:
            return Placement(None, f"one GPU ({main}): both branches on it ('{SECOND}' does nothing here)")
        target = others[0]
    elif choice == main:
        return Placement(None, f"{choice} is the conditional branch's card: both branches on it")
    elif choice not in devices:
        return Placement(
            None, f"{choice} is not present ({len(devices)} GPU(s) here): both branches on {main} ('{choice}' ignored)"
        )
    else:
        target = choice
    return Placement(
        target, f"unconditional branch on {target}, its pass run at the same time as the conditional one on {main}"
    )


def to_device(obj, device: torch.device):
    """``obj`` with every tensor in it (through dicts, lists and tuples) on ``device``; containers are rebuilt, other
    values kept as they are (functions, options, None)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(to_device(v, device) for v in obj)
    return obj
