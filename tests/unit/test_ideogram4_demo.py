"""`python -m comfyui_ideogram4_int8 demo` runs end to end on the CPU (on a GPU: cuda/test_ideogram4_demo_gpu.py), and
the Python example of docs/python.md runs as written on the file the demo wrote.

No timing is asserted here (speed belongs to bench/); docs/performance.md states the measured demo time.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from comfyui_ideogram4_int8.ideogram4.demo import physical_cores
from demo_checks import check_demo, demo_env, run_demo

PYTHON_DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


@pytest.fixture(scope="module")
def cpu_demo(tmp_path_factory):
    """One CPU demo run with the default --out (demo_out in the working folder), shared by the tests below."""
    cwd = tmp_path_factory.mktemp("demo")
    out = run_demo(cwd, int.from_bytes(os.urandom(2), "little") % 1000, "cpu")
    return cwd, out


def test_demo_on_cpu(cpu_demo):
    cwd, out = cpu_demo
    summary = check_demo(cwd / "demo_out", out, "cublas-int8")
    assert summary["device"] == "cpu"
    if not os.environ.get("OMP_NUM_THREADS"):  # the demo's own choice on the CPU (docs/performance.md: measured)
        # the load average moves while the demo starts: its choice lies between the busiest and the idle answer
        cores = physical_cores()
        assert 1 <= summary["threads"] <= cores and f"{summary['threads']} CPU thread(s)" in out.stdout


def test_demo_on_a_cpu_that_runs_the_dequantized_matmul_lists_no_second_path(tmp_path):
    # cpu-gemm=float: what a CPU without VNNI measures (the test suite pins int8 elsewhere)
    out = run_demo(
        tmp_path, 7, "cpu", "--out", str(tmp_path), env=demo_env(IDEOGRAM4_INT8_EXPERIMENTS="cpu-gemm=float")
    )
    summary = check_demo(tmp_path, out, "dequant-bf16")
    assert not any("phantom" in k for k in summary["fidelity"])


def test_seconds_since_process_start_counts_from_the_process_start():
    code = (
        "import time; time.sleep(1.5)\n"
        "from comfyui_ideogram4_int8.ideogram4.demo import seconds_since_process_start as age\n"
        "t = age(); print('none' if t is None else t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=demo_env())
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
        env=demo_env(OMP_NUM_THREADS="1"),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-1] == "torch.Size([1, 128, 16, 16])"


def test_demo_refuses_a_file_as_out_folder_in_one_line(tmp_path):
    (tmp_path / "taken").write_text("x")
    out = run_demo(tmp_path, 0, "cpu", "--out", str(tmp_path / "taken"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "argument --out" in out.stderr
