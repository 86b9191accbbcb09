"""Shared helpers for the demo tests (unit/ on the CPU, cuda/ on a GPU): run `python -m comfyui_ideogram4_int8 demo`
as a user would and check what it wrote and printed."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import torch
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from PIL import Image


def demo_env(**extra):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the demo must pick its paths like a user's run
    env.update(extra)
    return env


def run_demo(cwd, seed, device, *extra, env=None):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "comfyui_ideogram4_int8",
            "demo",
            "--seed",
            str(seed),
            "--device",
            device,
            "--preset",
            "Turbo 12",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env or demo_env(),
        cwd=cwd,
    )


def check_demo(out_dir: pathlib.Path, out, fused_path):
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads((out_dir / "demo_summary.json").read_text())
    assert summary["ok"] and all(v >= 0.99 for v in summary["fidelity"].values())
    cfg = Ideogram4Config.demo()
    n_quant = len(cfg.default_quantized()) - cfg.num_layers // 2  # odd blocks keep feed_forward.w2 in bf16
    for branch in ("conditional", "unconditional"):
        rows = [r for r in summary["gemm_paths"] if r["model"] == branch]
        per_path = {p: sum(r["layers"] for r in rows if r["path"] == p) for p in {r["path"] for r in rows}}
        assert per_path == {fused_path: n_quant, "bf16": len(cfg.linear_names()) - n_quant}

    # the PNG explains itself: a text band on top, then three 256 x 256 panels (W8A8 | bf16 | difference)
    img = np.array(Image.open(out_dir / "demo_preview.png").convert("RGB"))
    assert img.shape[1] >= 3 * 256 and img.shape[0] > 256 + 100
    dark = (img.max(axis=2) < 100).sum(axis=1)  # dark pixels per row: text, or a panel
    text_rows = dark[:60]
    assert (text_rows > 0).sum() > 20, "no title text on top of the preview"
    pixels = torch.from_numpy(img).reshape(-1, 3)
    assert len(torch.unique(pixels, dim=0)) > 100  # pictures, not a flat fill

    # the printed tables: every header matches its rows
    text = out.stdout
    assert "GEMM path" in text and "why not a faster path" in text
    fid = text[text.index("\nfidelity") :]
    assert re.search(r"sampled latent: W8A8 vs bf16\s+cosine similarity \(1 = identical\)\s+0\.99", fid)
    assert re.search(r"sampled latent: W8A8 vs bf16\s+relative L2 error \(0 = identical\)\s+0\.0", fid)
    assert f"{summary['latent_rel_err']:.5f}" in fid
    _check_fidelity_names_paths_that_ran(summary, fid)

    # the times say what they cover; the last is the process's wall time (Python's start and torch's import included)
    assert summary["w8a8_sampling_seconds"] <= summary["demo_seconds"]
    if summary["process_seconds"] is not None:
        assert summary["process_seconds"] > summary["demo_seconds"]
        assert f"{summary['process_seconds']:.1f} s since the process started" in text
    return summary


def _check_fidelity_names_paths_that_ran(summary, table):
    """Each forward row names the path that ran in it: W8A8's own (the GEMM-path table's), and the phantom-INT8
    comparison only where W8A8 ran another path (on a CPU that measured the dequantized matmul faster it is W8A8's
    path, and the row would list a path that did not run as a comparison)."""
    quantized = {r["path"] for r in summary["gemm_paths"] if r["path"] != "bf16"}
    assert len(quantized) == 1, summary["gemm_paths"]
    (ran,) = quantized
    forward = [k for k in summary["fidelity"] if " forward: " in k]
    expected = [f"{b} forward: W8A8 ({ran}) vs bf16" for b in ("conditional", "unconditional")]
    if ran != "dequant-bf16":
        expected += [f"{b} forward: phantom INT8 (dequant-bf16) vs bf16" for b in ("conditional", "unconditional")]
    assert sorted(forward) == sorted(expected)
    for key in forward:
        assert key in table
