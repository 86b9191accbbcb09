"""`python -m comfyui_ideogram4_int8 demo` on a GPU runs its quantized linears through the fused Triton kernel.

No timing is asserted here (speed belongs to bench/); docs/performance.md states the measured demo time.
"""

from __future__ import annotations

import pytest
import torch
from demo_checks import check_demo, run_demo
from ideogram4_checks import seed_of


@pytest.mark.cuda
def test_demo_on_gpu_uses_the_fused_kernel(tmp_path, gen):
    assert torch.cuda.is_available()
    out = run_demo(tmp_path, seed_of(gen) % 1000, "cuda", "--out", str(tmp_path))
    check_demo(tmp_path, out, "triton-int8")
