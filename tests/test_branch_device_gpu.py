"""Two GPUs (cuda, ComfyUI): the unconditional MODEL on the second card through the Branch Device node gives the
latent of both branches on one card (cosine >= 0.99999), each pass ran on its card, and the pack's fused path ran
on both. Skips with fewer than two GPUs or without a ComfyUI checkout (COMFYUI_DIR)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
import torch

pytestmark = pytest.mark.cuda  # not `comfyui`: the CI's ComfyUI stage has no GPU and must skip nothing
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_unconditional_branch_on_the_second_gpu_equals_one_gpu(tmp_path):
    if not os.environ.get("COMFYUI_DIR"):
        pytest.skip("needs a ComfyUI 0.33 checkout: set COMFYUI_DIR")
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"])
    python = os.environ.get("COMFYUI_PYTHON") or str(comfy_dir / ".venv" / "bin" / "python")
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "comfyui_ideogram4_int8").symlink_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["COMFY_GPU"] = "1"
    seed = int.from_bytes(os.urandom(3), "little")
    script = str(ROOT / "tests" / "comfy_nodes_script.py")
    args = [python, script, str(comfy_dir), str(tmp_path / "pack"), str(tmp_path), "branch_device", str(seed)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"seed {seed}: no result\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    res = json.loads(lines[-1][len("RESULT ") :])
    assert "__error__" not in res, res["__error__"]
    gpu = res["gpu"]
    assert gpu["note"].startswith("unconditional branch on cuda:1"), gpu["note"]
    assert gpu["cosine"] >= 0.99999, (seed, gpu["cosine"])
    assert gpu["ran_on"] == {"conditional": ["cuda:0"], "unconditional": ["cuda:1"]}
    assert all("triton-int8" in paths for paths in gpu["paths"].values()), gpu["paths"]  # the fused path, both
