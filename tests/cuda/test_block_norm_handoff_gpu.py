"""GPU (cuda, ComfyUI): the blocks' pre-norms hand their quantized output to the linears they feed
(nodes/runtime/block_norms.py, kernels/handoff.py) in a sampled run through ComfyUI, and the latent equals the one
without the handoff bit for bit. Skips without a GPU or a ComfyUI checkout (COMFYUI_DIR)."""

from __future__ import annotations

import pytest
import torch
from comfy_check_run import run_nodes_check_on_gpu

pytestmark = pytest.mark.cuda  # not `comfyui`: the CI's ComfyUI stage has no GPU and must skip nothing


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_sampled_latent_with_the_handoff_equals_the_one_without(tmp_path):
    res = run_nodes_check_on_gpu(
        tmp_path, "block_norm_handoff", drop_env=("IDEOGRAM4_INT8_EXPERIMENTS", "IDEOGRAM4_INT8_CUDA_GRAPHS")
    )
    seed = res["__seed__"]
    assert res["gpu/equal"], (seed, res["gpu/max_abs"])
    # Turbo 12 at 512 px: 12 steps x 2 passes, each block's attention and FFN take their inputs handed over
    assert res["gpu/handoffs"] == 12 * 2 * 2 * res["gpu/layers"], (seed, res["gpu/handoffs"])
    assert res["gpu/off_handoffs"] == 0 and res["gpu/pending"] is False
    assert res["gpu/note"] == res["handoff_note"], res["gpu/note"]
    assert "no-handoff" in res["gpu/off_note"], res["gpu/off_note"]
