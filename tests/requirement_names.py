"""Names of Python distributions as the install-path tests compare them (unit/ and comfyui/ share these)."""

from __future__ import annotations

import re

# torch and what ships with it: requirements.txt must never make pip re-resolve the user's copy
TORCH_FAMILY = re.compile(r"^(torch|torchvision|torchaudio|torchsde|triton|nvidia-.*)$")


def canon(name: str) -> str:
    """A distribution name in its normalized form (PEP 503): runs of ``-_.`` as one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()
