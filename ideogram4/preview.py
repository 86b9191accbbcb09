"""A PNG preview of an Ideogram 4 latent without a VAE (for the demo and quick looks).

The 128 latent channels are 2x2 patches of 32 VAE channels; the preview unpatchifies them and
projects the 32 channels onto their first three principal components (one shared projection
for all latents passed together, so side-by-side panels are comparable).
"""

from __future__ import annotations

import pathlib

import torch


def unpatchify(latent: torch.Tensor, patch: int = 2) -> torch.Tensor:
    """[C*p*p, gh, gw] (channel order c, pi, pj) -> [C, gh*p, gw*p]."""
    c, gh, gw = latent.shape
    ae = c // (patch * patch)
    return latent.reshape(ae, patch, patch, gh, gw).permute(0, 3, 1, 4, 2).reshape(ae, gh * patch, gw * patch)


def latents_to_rgb(latents: list[torch.Tensor], scale: int = 8) -> list[torch.Tensor]:
    """Each [128, gh, gw] -> uint8 [H, W, 3] through one shared PCA projection."""
    planes = [unpatchify(lat.detach().float().cpu()) for lat in latents]
    pix = torch.cat([p.reshape(p.shape[0], -1) for p in planes], dim=1).T  # [pixels, 32]
    mean = pix.mean(0, keepdim=True)
    _, _, v = torch.linalg.svd(pix - mean, full_matrices=False)
    basis = v[:3].T  # [32, 3]
    proj = [((p.reshape(p.shape[0], -1).T - mean) @ basis) for p in planes]
    allp = torch.cat(proj)
    lo, hi = allp.quantile(0.01, dim=0), allp.quantile(0.99, dim=0)
    out = []
    for p, plane in zip(proj, planes, strict=True):
        img = ((p - lo) / (hi - lo).clamp_min(1e-6)).clamp(0, 1).reshape(plane.shape[1], plane.shape[2], 3)
        img = img.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        out.append((img * 255).round().to(torch.uint8))
    return out


def save_preview(path: str | pathlib.Path, latents: list[torch.Tensor], gap: int = 8) -> pathlib.Path:
    """Side-by-side PNG of latents [128, gh, gw] (same size), separated by white gaps."""
    from PIL import Image

    imgs = latents_to_rgb(latents)
    h = imgs[0].shape[0]
    sep = torch.full((h, gap, 3), 255, dtype=torch.uint8)
    row = [imgs[0]]
    for im in imgs[1:]:
        row += [sep, im]
    canvas = torch.cat(row, dim=1).numpy()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas).save(path)
    return path
