"""Run one check of ``comfy_nodes_script.py`` in ComfyUI's Python with ComfyUI on the GPU(s) (``COMFY_GPU=1``), for the
``cuda`` tests that need a real ComfyUI; skips without a checkout (``COMFYUI_DIR``)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_nodes_check_on_gpu(tmp_path: pathlib.Path, check: str, drop_env: tuple[str, ...] = ()) -> dict:
    """The check's RESULT (with ``__seed__``); ``drop_env``: variables the check must not inherit."""
    if not os.environ.get("COMFYUI_DIR"):
        pytest.skip("needs a ComfyUI 0.33 checkout: set COMFYUI_DIR")
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"])
    python = os.environ.get("COMFYUI_PYTHON") or str(comfy_dir / ".venv" / "bin" / "python")
    (tmp_path / "pack").mkdir()
    (tmp_path / "pack" / "comfyui_ideogram4_int8").symlink_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", *drop_env)}
    env["COMFY_GPU"] = "1"
    seed = int.from_bytes(os.urandom(3), "little")
    script = str(ROOT / "tests" / "comfy_nodes_script.py")
    args = [python, script, str(comfy_dir), str(tmp_path / "pack"), str(tmp_path), check, str(seed)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"seed {seed}: no result\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    res = json.loads(lines[-1][len("RESULT ") :])
    assert "__error__" not in res, f"seed {seed}:\n{res['__error__']}"
    res["__seed__"] = seed
    return res
