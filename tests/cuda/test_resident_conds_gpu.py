"""GPU (cuda, ComfyUI): in a sampled run through ComfyUI, the pack's models get their context already on the GPU
(nodes/runtime/resident_conds.py): the per-call cast copies nothing, where with ComfyUI's own extra_conds it makes a
copy in every call, and the latent is the same bit for bit. Skips without a GPU or a ComfyUI checkout (COMFYUI_DIR)."""

from __future__ import annotations

import pytest
import torch
from comfy_check_run import run_nodes_check_on_gpu

pytestmark = pytest.mark.cuda  # not `comfyui`: the CI's ComfyUI stage has no GPU and must skip nothing


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_sampled_run_casts_the_context_once_and_samples_the_same_latent(tmp_path):
    res = run_nodes_check_on_gpu(tmp_path, "resident_conds", drop_env=("IDEOGRAM4_INT8_CUDA_GRAPHS",))
    seed = res["__seed__"]
    assert res["gpu/calls"] >= 12, (seed, res["gpu/calls"])  # Turbo 12: the conditional model, every step
    assert res["gpu/casts"] == [str(["cuda", True])], (seed, res["gpu/casts"])  # on the GPU already, no copy
    # ComfyUI's own extra_conds: the pack's sampler moved the float32 context to the GPU once per run, and the
    # per-call cast still makes a bf16 copy of it in every call
    assert res["gpu/own_casts"] == [str(["cuda", False])], (seed, res["gpu/own_casts"])
    assert res["gpu/equal"] is True, seed
