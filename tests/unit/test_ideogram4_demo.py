"""`python -m comfyui_ideogram4_int8 demo` runs end to end on the CPU (and through the fused path on a GPU), and the
Python example of docs/python.md runs as written on the file the demo wrote.

No timing is asserted here (speed belongs to bench/); docs/performance.md states the measured demo time.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from comfyui_ideogram4_int8.ideogram4.config import Ideogram4Config
from comfyui_ideogram4_int8.ideogram4.demo import physical_cores
from ideogram4_checks import seed_of
from PIL import Image

PYTHON_DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def _env(**extra):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the demo must pick its paths like a user's run
    env.update(extra)
    return env


def _run_demo(cwd, seed, device, *extra, env=None):
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
        env=env or _env(),
        cwd=cwd,
    )


def _check(out_dir: pathlib.Path, out, fused_path):
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


@pytest.fixture(scope="module")
def cpu_demo(tmp_path_factory):
    """One CPU demo run with the default --out (demo_out in the working folder), shared by the tests below."""
    cwd = tmp_path_factory.mktemp("demo")
    out = _run_demo(cwd, int.from_bytes(os.urandom(2), "little") % 1000, "cpu")
    return cwd, out


def test_demo_on_cpu(cpu_demo):
    cwd, out = cpu_demo
    summary = _check(cwd / "demo_out", out, "cublas-int8")
    assert summary["device"] == "cpu"
    if not os.environ.get("OMP_NUM_THREADS"):  # the demo's own choice on the CPU (docs/performance.md: measured)
        # the load average moves while the demo starts: its choice lies between the busiest and the idle answer
        cores = physical_cores()
        assert 1 <= summary["threads"] <= cores and f"{summary['threads']} CPU thread(s)" in out.stdout


def test_demo_on_a_cpu_that_runs_the_dequantized_matmul_lists_no_second_path(tmp_path):
    # cpu-gemm=float: what a CPU without VNNI measures (the test suite pins int8 elsewhere)
    out = _run_demo(tmp_path, 7, "cpu", "--out", str(tmp_path), env=_env(IDEOGRAM4_INT8_EXPERIMENTS="cpu-gemm=float"))
    summary = _check(tmp_path, out, "dequant-bf16")
    assert not any("phantom" in k for k in summary["fidelity"])


def test_seconds_since_process_start_counts_from_the_process_start():
    code = (
        "import time; time.sleep(1.5)\n"
        "from comfyui_ideogram4_int8.ideogram4.demo import seconds_since_process_start as age\n"
        "t = age(); print('none' if t is None else t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env())
    assert out.returncode == 0, out.stderr
    if not pathlib.Path("/proc/self/stat").is_file():
        assert out.stdout.strip() == "none"
        return
    assert float(out.stdout) >= 1.5  # the sleep before the import is counted


def _python_doc_example() -> str:
    text = PYTHON_DOC.read_text()
    block = text.split("<!-- python-example -->", 1)[1]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    assert "read_branch" in code and "text_features =" in code and "import torch" in code
    return code


def test_documented_python_example_runs_as_written_on_the_demo_file(cpu_demo):
    cwd, demo = cpu_demo
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # one thread: the tiny model on a shared 2-core machine (more threads only add contention)
    run = subprocess.run(
        [sys.executable, "-c", _python_doc_example()],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=_env(OMP_NUM_THREADS="1"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "torch.Size([1, 128, 16, 16])"


def test_demo_refuses_a_file_as_out_folder_in_one_line(tmp_path):
    (tmp_path / "taken").write_text("x")
    out = _run_demo(tmp_path, 0, "cpu", "--out", str(tmp_path / "taken"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "argument --out" in out.stderr


@pytest.mark.cuda
def test_demo_on_gpu_uses_the_fused_kernel(tmp_path, gen):
    assert torch.cuda.is_available()
    out = _run_demo(tmp_path, seed_of(gen) % 1000, "cuda", "--out", str(tmp_path))
    _check(tmp_path, out, "triton-int8")
