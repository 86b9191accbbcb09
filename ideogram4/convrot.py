"""ConvRot: the block-diagonal Hadamard rotation of ComfyUI's ``int8_tensorwise`` + ``convrot``.

H_n = H4^{(x)k} / sqrt(n) with the "regular" H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],[-1,1,1,1]],
n = 4**k (16, 64, 256, ...). H_n is symmetric and orthonormal (H_n @ H_n = I). A ConvRot weight
is stored rotated along K, group by group: ``W_rot[:, g] = W[:, g] @ H^T``; the activation is
rotated the same way online, ``x_rot[:, g] = x[:, g] @ H``, so ``x_rot @ W_rot^T = x @ W^T``
and the output needs no un-rotation.
"""

from __future__ import annotations

import functools

import torch

_H4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))


def check_group_size(group: int) -> None:
    n = int(group)
    k = 0
    while n > 1 and n % 4 == 0:
        n //= 4
        k += 1
    if n != 1 or k == 0:
        raise ValueError(f"ConvRot group size must be a power of 4 (16, 64, 256, ...); got {group}")


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(group: int) -> torch.Tensor:
    check_group_size(group)
    h4 = torch.tensor(_H4, dtype=torch.float64)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < group:
        h = torch.kron(h, h4)
    return (h / group**0.5).contiguous()


def hadamard(group: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """The orthonormal symmetric [group, group] rotation H_group."""
    return _hadamard_cpu(int(group)).to(dtype=dtype, device=device)


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] -> x_rot with x_rot[..., g] = x[..., g] @ H per group of ``group`` columns.

    Math in float32 (float64 stays float64); returns x's dtype. K must be a multiple of group.
    """
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"ConvRot: K={k} is not a multiple of the group size {group}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = hadamard(group, work, x.device)
    xg = x.to(work).reshape(*x.shape[:-1], k // group, group)
    return (xg @ h).reshape(x.shape).to(x.dtype)


def rotate_weight(weight: torch.Tensor, group: int) -> torch.Tensor:
    """Float weight [N, K] -> W_rot[:, g] = W[:, g] @ H^T (H is symmetric: @ H)."""
    return rotate(weight, group)
