"""Test-wide setup.

* Without a GPU the Triton kernels run on the CPU interpreter: TRITON_INTERPRET=1 must be set
  before triton compiles anything, so it is set here, before any test module imports kernels.
* `cuda` tests skip without a CUDA GPU; `comfyui` tests skip without COMFYUI_DIR.
"""

from __future__ import annotations

import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    skip_comfy = pytest.mark.skip(reason="needs a ComfyUI 0.33 checkout: set COMFYUI_DIR")
    has_comfy = bool(os.environ.get("COMFYUI_DIR"))
    for item in items:
        if "cuda" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip_cuda)
        if "comfyui" in item.keywords and not has_comfy:
            item.add_marker(skip_comfy)


@pytest.fixture
def gen():
    """A fresh, differently seeded generator per test: kernels must be right on any data.

    Failure messages print ``gen.initial_seed()`` so a failing draw can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    return g
