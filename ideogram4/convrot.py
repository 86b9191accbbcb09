"""ConvRot: the block-diagonal Hadamard rotation of ComfyUI's ``int8_tensorwise`` + ``convrot``.

H_n = H4^{(x)k} / sqrt(n) with the "regular" H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]],
n = 4**k (16, 64, 256, ...). H_n is symmetric and orthonormal (H_n @ H_n = I). A ConvRot weight
is stored rotated along K, group by group: ``W_rot[:, g] = W[:, g] @ H^T``; the activation is
rotated the same way online, ``x_rot[:, g] = x[:, g] @ H``, so ``x_rot @ W_rot^T = x @ W^T``
and the output needs no un-rotation.
"""

from __future__ import annotations

import torch

from ..kernels.reference import hadamard, rotate_ref

__all__ = ["check_group_size", "hadamard", "rotate", "rotate_weight"]


def check_group_size(group: int) -> None:
    hadamard(group)  # raises ValueError naming the group size


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] -> x_rot with x_rot[..., g] = x[..., g] @ H per group of ``group`` columns (float32 math)."""
    return rotate_ref(x, group)


def rotate_weight(weight: torch.Tensor, group: int) -> torch.Tensor:
    """Float weight [N, K] -> W_rot[:, g] = W[:, g] @ H^T (H is symmetric: @ H)."""
    return rotate_ref(weight, group)
