"""The ComfyUI benchmark's smoke run (``bench.comfy --config demo``: the tiny demo model on the CPU, inside ComfyUI's
own Python) through both samplers it measures: the pack's sampler node and ComfyUI's own Dual Model CFG Guider +
SamplerCustomAdvanced. Numbers from it mean nothing; what is checked is that each sampler ran the pack's MODELs to a
finite latent, that the run says which sampler it used, and that the native one reached the pack's linears."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.comfyui
@pytest.mark.parametrize("sampler", ["pack", "native"])
def test_the_demo_benchmark_samples_through_each_sampler(tmp_path, sampler):
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"])
    python = os.environ.get("COMFYUI_PYTHON") or str(comfy_dir / ".venv" / "bin" / "python")
    pack_parent = tmp_path / "pack"
    pack_parent.mkdir()
    (pack_parent / "comfyui_ideogram4_int8").symlink_to(ROOT)
    out_json, latents = tmp_path / "out.json", tmp_path / "latents"
    cmd = [
        python,
        "-m",
        "comfyui_ideogram4_int8.bench.comfy",
        "--comfyui",
        str(comfy_dir),
        "--workdir",
        str(tmp_path / "work"),
        "--config",
        "demo",
        "--peers",
        "ours-w8a8",
        "--steps",
        "3",
        "--sampler",
        sampler,
        "--latents",
        str(latents),
        "--out",
        str(out_json),
    ]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(pack_parent)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out_json.read_text())
    assert result["info"]["sampler"] == sampler
    peer = result["peers"]["ours-w8a8"]
    assert "error" not in peer, peer
    assert peer["step_ms"] > 0
    # both branches' linears ran through the pack's op (3 steps, both passes), whichever sampler drove them
    for branch in ("conditional", "unconditional"):
        assert sum(peer["paths"][branch].values()) > 0, (branch, peer["paths"])
    latent = torch.load(latents / "ours-w8a8.pt")
    assert latent.shape[1] == 128 and torch.isfinite(latent).all()
