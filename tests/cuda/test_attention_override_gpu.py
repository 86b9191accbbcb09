"""The pack's attention override on a GPU: cuDNN SDPA first at Ideogram's head dimension
(nodes/runtime/attention_override.py; its CPU logic is tests/unit/test_attention_override.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comfyui_ideogram4_int8.kernels import attention_choice
from comfyui_ideogram4_int8.nodes.runtime import attention_override as A
from kernel_checks import rel_err

pytestmark = pytest.mark.cuda


def _qkv(gen, b=1, h=2, n=40, d=64, dtype=torch.float32, device="cpu"):
    return [torch.randn(b, h, n, d, generator=gen).to(device, dtype) for _ in range(3)]


@pytest.mark.parametrize("n", [4096, 4608 + 512, 77])
def test_sdpa_cudnn_first_matches_float32_at_head_dim_256(n, gen, setting):
    if A.PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    setting("IDEOGRAM4_INT8_ATTENTION", "sdpa")
    attention_choice.clear()
    override = A.PackAttention()
    q, k, v = _qkv(gen, h=18, n=n, d=256, dtype=torch.bfloat16, device="cuda")
    out = override(None, q, k, v, 18, skip_reshape=True)
    assert out.shape == (1, n, 18 * 256) and out.dtype == torch.bfloat16 and override.runs["sdpa"] == 1
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).transpose(1, 2).reshape(1, n, -1)
    assert rel_err(out, ref) < 1e-2, f"seed {gen.initial_seed()}"
