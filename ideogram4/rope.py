"""Interleaved 3-axis MRoPE (Qwen3-VL style) with split-half rotation, as Ideogram 4 uses it.

Each token has a position (t, h, w). Frequencies ``inv_freq[i] = theta ** (-2i / head_dim)``
for i < head_dim / 2; pair i rotates by ``pos_axis(i) * inv_freq[i]`` where the axis is t by
default, h for i = 1, 4, 7, ... < 3 * sections[1] and w for i = 2, 5, 8, ... < 3 * sections[2].
The rotation pairs element i with element i + head_dim / 2 ("split half", rotate_half).
"""

from __future__ import annotations

import torch

TEXT_POSITION_AXES = 3
IMAGE_POSITION_OFFSET = 65536  # image grid positions never collide with text positions


def mrope_angles(position_ids: torch.Tensor, head_dim: int, theta: float, sections) -> torch.Tensor:
    """position_ids [L, 3] (t, h, w) integers -> rotation angles float32 [L, head_dim / 2]."""
    if position_ids.dim() != 2 or position_ids.shape[1] != TEXT_POSITION_AXES:
        raise ValueError(f"position_ids must be [L, 3]; got {tuple(position_ids.shape)}")
    half = head_dim // 2
    exponent = torch.arange(0, head_dim, 2, device=position_ids.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    pos = position_ids.float()
    per_axis = [pos[:, a, None] * inv_freq[None, :] for a in range(3)]  # 3 x [L, half]
    angles = per_axis[0].clone()
    for axis in (1, 2):
        idx = slice(axis, min(3 * int(sections[axis]), half), 3)
        angles[:, idx] = per_axis[axis][:, idx]
    return angles


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, sections):
    angles = mrope_angles(position_ids, head_dim, theta, sections)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D]; cos, sin [L, D/2] float32 -> rotated x in x's dtype (math in float32)."""
    dtype = x.dtype
    xf = x.float()
    half = xf.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(dtype)


def image_position_ids(grid_h: int, grid_w: int, device=None) -> torch.Tensor:
    """[grid_h * grid_w, 3] positions (0, row, col) + IMAGE_POSITION_OFFSET, row-major."""
    rows = torch.arange(grid_h, device=device).repeat_interleave(grid_w)
    cols = torch.arange(grid_w, device=device).repeat(grid_h)
    return torch.stack((torch.zeros_like(rows), rows, cols), dim=1) + IMAGE_POSITION_OFFSET


def text_position_ids(length: int, device=None) -> torch.Tensor:
    """[length, 3]: text token j sits at (j, j, j)."""
    return torch.arange(length, device=device)[:, None].expand(length, 3)
