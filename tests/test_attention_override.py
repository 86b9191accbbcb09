"""The pack's attention override for its ComfyUI MODELs (nodes/attention_override.py, no ComfyUI import)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from comfyui_ideogram4_int8.nodes import attention_override as A
from kernel_checks import rel_err


def _qkv(gen, b=1, h=2, n=40, d=64, dtype=torch.float32, device="cpu"):
    return [torch.randn(b, h, n, d, generator=gen).to(device, dtype) for _ in range(3)]


def test_everything_it_does_not_serve_goes_to_comfyuis_function_unchanged(gen):
    calls = []

    def comfy_attention(q, k, v, heads, **kw):
        calls.append((q, heads, kw))
        return "comfyui"

    q, k, v = _qkv(gen)
    mask = torch.zeros(1, 1, 40, 40)
    cases = [
        dict(),  # CPU tensors
        dict(mask=mask),
        dict(skip_reshape=False),
    ]
    for extra in cases:
        kw = dict(skip_reshape=True, transformer_options={"x": 1}) | extra
        assert A.cudnn_first_attention(comfy_attention, q, k, v, 2, **kw) == "comfyui"
        assert calls[-1][0] is q and calls[-1][1] == 2 and calls[-1][2]["transformer_options"] == {"x": 1}
        assert calls[-1][2]["mask"] is extra.get("mask")
    assert len(calls) == len(cases)


def test_install_respects_the_switch_and_an_earlier_override(setting):
    opts: dict = {}
    said = A.install(opts)
    if A._PRIORITY is None:
        assert "cannot order" in said and opts == {}
        return
    assert opts["transformer_options"][A.KEY] is A.cudnn_first_attention and "cuDNN" in said
    theirs = {"transformer_options": {A.KEY: lambda *a, **k: None}}
    assert "kept" in A.install(theirs) and theirs["transformer_options"][A.KEY] is not A.cudnn_first_attention
    setting("IDEOGRAM4_INT8_ATTENTION", "comfyui")
    off: dict = {}
    assert "comfyui" in A.install(off) and off == {}


@pytest.mark.cuda
@pytest.mark.parametrize("n", [4096, 4608 + 512, 77])
def test_cudnn_first_attention_matches_float32_at_head_dim_256(n, gen):
    if A._PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    q, k, v = _qkv(gen, h=18, n=n, d=256, dtype=torch.bfloat16, device="cuda")
    out = A.cudnn_first_attention(None, q, k, v, 18, skip_reshape=True)
    assert out.shape == (1, n, 18 * 256) and out.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).transpose(1, 2).reshape(1, n, -1)
    assert rel_err(out, ref) < 1e-2, f"seed {gen.initial_seed()}"


def test_the_summary_names_what_runs_on_the_models_device():
    if A._PRIORITY is None:
        pytest.skip("this torch cannot order SDPA backends")
    opts: dict = {}
    said = A.install(opts, torch.device("cpu"))
    assert said.startswith("attention: ComfyUI's own on the CPU") and "~2x" not in said
    assert opts["transformer_options"][A.KEY] is A.cudnn_first_attention  # kept: it passes CPU tensors through
    assert "cuDNN first" in A.install({}, torch.device("cuda", 0))
