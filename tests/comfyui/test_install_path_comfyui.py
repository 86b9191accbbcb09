"""The install path in ComfyUI's own environment: a dry run of ``pip install -r requirements.txt`` there
(``--no-index``: no network) would install or change nothing torch-related. The CPU half of this check is
unit/test_install_path.py."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from requirement_names import TORCH_FAMILY, canon

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.comfyui
def test_pip_dry_run_in_comfyuis_environment_leaves_torch_alone(tmp_path):
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"])
    python = os.environ.get("COMFYUI_PYTHON") or str(comfy_dir / ".venv" / "bin" / "python")
    torch_before = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, timeout=300
    ).stdout.strip()
    report = tmp_path / "report.json"
    out = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--quiet",
            "--report",
            str(report),
            "-r",
            str(ROOT / "requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"install the pack's requirements into ComfyUI's environment first:\n{out.stderr}"
    would_install = {
        canon(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]
    }
    assert not {n for n in would_install if TORCH_FAMILY.match(n)}, would_install
    torch_after = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, timeout=300
    ).stdout.strip()
    assert torch_before and torch_after == torch_before
