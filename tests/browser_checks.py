"""What the headless-Chromium tests share: whether the browser stack is there, and where screenshots go."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def has_playwright() -> bool:
    """node, playwright-core resolvable by it (NODE_PATH) and Debian's chromium."""
    node = shutil.which("node")
    if not node or not pathlib.Path(CHROMIUM).exists():
        return False
    probe = subprocess.run([node, "-e", "require.resolve('playwright-core')"], capture_output=True, timeout=30)
    return probe.returncode == 0


def shots_dir(tmp_path: pathlib.Path, env_var: str) -> pathlib.Path:
    """The folder for a test's screenshots (``env_var`` names one to keep them; else a pytest tmp folder); skips the
    test when the browser stack is missing."""
    if not has_playwright():
        pytest.skip("needs node, playwright-core on NODE_PATH and chromium")
    out = pathlib.Path(os.environ.get(env_var) or tmp_path / "shots")
    out.mkdir(parents=True, exist_ok=True)
    return out
