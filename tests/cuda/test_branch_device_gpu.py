"""Two GPUs (cuda, ComfyUI): the unconditional MODEL on the second card through the Branch Device node gives the
latent of both branches on one card (cosine >= 0.99999), each pass ran on its card, and the pack's fused path ran
on both. Skips with fewer than two GPUs or without a ComfyUI checkout (COMFYUI_DIR)."""

from __future__ import annotations

import pytest
import torch
from comfy_check_run import run_nodes_check_on_gpu

pytestmark = pytest.mark.cuda  # not `comfyui`: the CI's ComfyUI stage has no GPU and must skip nothing


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_unconditional_branch_on_the_second_gpu_equals_one_gpu(tmp_path):
    res = run_nodes_check_on_gpu(tmp_path, "branch_device")
    seed = res["__seed__"]
    gpu = res["gpu"]
    assert gpu["note"].startswith("unconditional branch on cuda:1"), gpu["note"]
    assert gpu["cosine"] >= 0.99999, (seed, gpu["cosine"])
    assert gpu["ran_on"] == {"conditional": ["cuda:0"], "unconditional": ["cuda:1"]}
    assert all("triton-int8" in paths for paths in gpu["paths"].values()), gpu["paths"]  # the fused path, both
