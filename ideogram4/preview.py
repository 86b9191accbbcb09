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


def difference_to_rgb(a: torch.Tensor, b: torch.Tensor, gain: float = 10.0, scale: int = 8) -> torch.Tensor:
    """|a - b| per pixel of latents [128, gh, gw] as a grey uint8 [H, W, 3] image.

    The per-pixel L2 norm of the difference over the 32 unpatchified channels, divided by the 99th percentile of
    ``b``'s per-pixel norm and multiplied by ``gain``: white = a difference of 1/gain of ``b``'s typical magnitude.
    """
    pa, pb = unpatchify(a.detach().float().cpu()), unpatchify(b.detach().float().cpu())
    diff = (pa - pb).norm(dim=0)
    ref = pb.norm(dim=0).flatten().quantile(0.99).clamp_min(1e-12)
    img = (diff / ref * gain).clamp(0, 1)
    img = img.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    return (img * 255).round().to(torch.uint8)[..., None].expand(-1, -1, 3).contiguous()


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1: a scalable font shipped with Pillow
    except TypeError:  # pragma: no cover - older Pillow: the small bitmap font
        return ImageFont.load_default()


def _wrap(draw, text: str, font, width: int) -> list[str]:
    lines = []
    for para in text.split("\n"):
        line = ""
        for word in para.split(" "):
            candidate = f"{line} {word}".strip()
            if line and draw.textlength(candidate, font=font) > width:
                lines.append(line)
                line = word
            else:
                line = candidate
        lines.append(line)
    return lines


def _text_lines(draw, x: int, y: int, lines, font, fill, step: int) -> int:
    """Draw ``lines`` one under the other from (x, y); returns the y below the last."""
    for line in lines:
        draw.text((x, y), line, fill=fill, font=font)
        y += step
    return y


def save_labelled_preview(
    path: str | pathlib.Path,
    panels: list[tuple[str, str, torch.Tensor]],
    title: str,
    notes: str = "",
    footer: str = "",
    gap: int = 16,
    margin: int = 16,
) -> pathlib.Path:
    """A PNG that explains itself: a title and notes on top, then one column per panel (a bold-ish heading, a
    caption under it, the image), then a footer. ``panels``: (heading, caption, uint8 [H, W, 3]); captions and notes
    wrap to the width they have."""
    from PIL import Image, ImageDraw

    big, small = _font(18), _font(13)
    h, w = panels[0][2].shape[:2]
    width = 2 * margin + len(panels) * w + (len(panels) - 1) * gap
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_big, line_small = 24, 17
    title_lines = _wrap(scratch, title, big, width - 2 * margin)
    note_lines = _wrap(scratch, notes, small, width - 2 * margin) if notes else []
    captions = [_wrap(scratch, caption, small, w) for _, caption, _ in panels]
    heads = [_wrap(scratch, head, big, w) for head, _, _ in panels]
    foot_lines = _wrap(scratch, footer, small, width - 2 * margin) if footer else []
    head_h = max(len(x) for x in heads) * line_big + max(len(c) for c in captions) * line_small + 6
    top = margin + len(title_lines) * line_big + len(note_lines) * line_small + 12
    height = top + head_h + h + 12 + len(foot_lines) * line_small + margin
    canvas = Image.new("RGB", (width, height), (250, 250, 248))
    draw = ImageDraw.Draw(canvas)
    y = _text_lines(draw, margin, margin, title_lines, big, (20, 20, 20), line_big)
    _text_lines(draw, margin, y, note_lines, small, (80, 80, 80), line_small)
    for i, ((_, _, img), head, caption) in enumerate(zip(panels, heads, captions, strict=True)):
        x = margin + i * (w + gap)
        yy = _text_lines(draw, x, top, head, big, (20, 20, 20), line_big)
        _text_lines(draw, x, yy, caption, small, (60, 60, 60), line_small)
        canvas.paste(Image.fromarray(img.numpy()), (x, top + head_h))
    _text_lines(draw, margin, top + head_h + h + 12, foot_lines, small, (20, 20, 20), line_small)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path


def stamp_banner(img: torch.Tensor, text: str, size: int = 13) -> torch.Tensor:
    """``img`` (uint8 [H, W, 3]) with ``text`` in white on a dark strip across its top (wrapped to the width)."""
    from PIL import Image, ImageDraw

    canvas = Image.fromarray(img.numpy())
    draw = ImageDraw.Draw(canvas)
    font, pad, step = _font(size), 4, size + 4
    lines = _wrap(draw, text, font, canvas.width - 2 * pad)
    draw.rectangle((0, 0, canvas.width, 2 * pad + len(lines) * step), fill=(20, 20, 20))
    _text_lines(draw, pad, pad, lines, font, (255, 255, 255), step)
    return torch.frombuffer(bytearray(canvas.tobytes()), dtype=torch.uint8).reshape(img.shape)
