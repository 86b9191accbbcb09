"""`python -m comfyui_ideogram4_int8 demo` runs end to end on the CPU (and through the fused path on a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from ideogram4_checks import seed_of
from PIL import Image


def _run_demo(tmp_path, seed, device):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the demo must pick its paths like a user's run
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "comfyui_ideogram4_int8", "demo", "--out", str(tmp_path), "--seed", str(seed),
         "--device", device, "--preset", "Turbo 12"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    return out, time.perf_counter() - t0


def _check(tmp_path, out, fused_path):
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((tmp_path / "demo_summary.json").read_text())
    assert summary["ok"] and all(v >= 0.99 for v in summary["fidelity"].values())
    cfg = Ideogram4Config.demo()
    n_quant = len(cfg.default_quantized()) - cfg.num_layers // 2  # odd blocks keep feed_forward.w2 in bf16
    for branch in ("conditional", "unconditional"):
        rows = [r for r in summary["gemm_paths"] if r["model"] == branch]
        per_path = {p: sum(r["layers"] for r in rows if r["path"] == p) for p in {r["path"] for r in rows}}
        assert per_path == {fused_path: n_quant, "bf16": len(cfg.linear_names()) - n_quant}
    img = Image.open(tmp_path / "demo_preview.png")
    assert img.size == (2 * 256 + 8, 256) and img.mode == "RGB"
    pixels = torch.from_numpy(np.array(img)).reshape(-1, 3)
    assert len(torch.unique(pixels, dim=0)) > 100  # a picture, not a flat fill
    assert "GEMM path" in out.stdout and "fidelity" in out.stdout
    return summary


def test_demo_on_cpu(tmp_path, gen):
    out, seconds = _run_demo(tmp_path, seed_of(gen) % 1000, "cpu")
    summary = _check(tmp_path, out, "cublas-int8")
    assert seconds < 120, f"demo took {seconds:.0f} s on the CPU"
    assert summary["device"] == "cpu"


@pytest.mark.cuda
def test_demo_on_gpu_uses_the_fused_kernel(tmp_path, gen):
    assert torch.cuda.is_available()
    out, _ = _run_demo(tmp_path, seed_of(gen) % 1000, "cuda")
    _check(tmp_path, out, "triton-int8")
