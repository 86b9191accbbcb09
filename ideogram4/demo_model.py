"""The CLI demo's embedded model, in pieces a ComfyUI graph can use (``nodes/demo_nodes.py``): no download at all.

* ``branch_state``: one branch of the demo model pair (``demo.MODEL_SEEDS``, ``Ideogram4Config.demo()``) in the form
  ``read_branch`` gives for a transformerlab W8A8 file (int8 linears with scales and SmoothQuant vectors, protected
  bf16 ``feed_forward.w2`` layers), built in memory by ``synthetic.w8a8_state``;
* ``text_features``: a deterministic stand-in for the 8B text encoder: each word of the prompt picks a seeded random
  vector of the demo model's text width. Not a language model: it only makes different prompts give different
  conditionings;
* ``decode``: latents to RGB without a VAE (``preview.latents_to_rgb``: the first three principal components of the
  32 unpatchified latent channels) with a banner stamped on each image saying it comes from random weights.
"""

from __future__ import annotations

import hashlib
import re

import torch

from .checkpoint import BranchStateDict
from .config import Ideogram4Config
from .demo import MODEL_SEEDS
from .preview import latents_to_rgb, stamp_banner
from .synthetic import RandomWeights, w8a8_state

BRANCHES = tuple(MODEL_SEEDS)
# registry labels: the panel's roles come from the prefix; "-demo" keeps them apart from a real loader's models
LABELS = {b: f"{b}-demo" for b in BRANCHES}
MAX_TOKENS = 64
BANNER = "RANDOM WEIGHTS - Ideogram 4 INT8 demo model, not a picture"
_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def config() -> Ideogram4Config:
    return Ideogram4Config.demo()


def branch_state(branch: str, dtype: torch.dtype = torch.float32) -> BranchStateDict:
    """One branch of the embedded demo model as ``read_branch`` would return it from the demo's W8A8 file."""
    if branch not in MODEL_SEEDS:
        raise ValueError(f"branch={branch!r}: the demo model has {list(MODEL_SEEDS)}")
    cfg = config()
    state = w8a8_state(RandomWeights(cfg, MODEL_SEEDS[branch]), cfg, branch=branch, dtype=dtype)
    state.file = f"<embedded demo model, seed {MODEL_SEEDS[branch]}>"
    return state


def tokens(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of ``text``, at most MAX_TOKENS; an empty text is one empty token."""
    return _WORD.findall(text.lower())[:MAX_TOKENS] or [""]


def text_features(text: str, features: int | None = None) -> torch.Tensor:
    """[1, tokens, features] float32: for each token, a random vector seeded by the token and its position.

    The same text gives the same tensor on every machine. ``features`` defaults to the demo model's text width."""
    features = config().llm_features_dim if features is None else int(features)
    rows = []
    for i, tok in enumerate(tokens(text)):
        seed = int.from_bytes(hashlib.sha256(f"{i}:{tok}".encode()).digest()[:7], "little")
        rows.append(torch.randn(features, generator=torch.Generator().manual_seed(seed)))
    return torch.stack(rows)[None]


def decode(latent: torch.Tensor, banner: str = BANNER) -> torch.Tensor:
    """Latents [B, 128, h, w] -> images [B, 16h, 16w, 3] float32 in [0, 1], ``banner`` (if any) stamped on each.

    One colour projection for the whole batch, so the images of a batch are comparable."""
    if latent.ndim != 4:
        raise ValueError(f"latent must be [batch, channels, height, width]; got shape {tuple(latent.shape)}")
    want = config().in_channels
    if latent.shape[1] != want:
        raise ValueError(f"latent has {latent.shape[1]} channels; the demo model's latents have {want}")
    images = latents_to_rgb(list(latent.detach().float().cpu()))
    stamped = [stamp_banner(img, banner) if banner else img for img in images]
    return torch.stack(stamped).float() / 255.0


__all__ = ["BRANCHES", "LABELS", "BANNER", "MAX_TOKENS", "config", "branch_state", "tokens", "text_features", "decode"]
