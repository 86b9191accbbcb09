"""Run one check of ``comfy_nodes_script.py`` in ComfyUI's Python (``COMFYUI_DIR``, ``COMFYUI_PYTHON``) and return
its RESULT: on the CPU for the ``comfyui`` tests, with ComfyUI on the GPU(s) (``COMFY_GPU=1``) for the ``cuda`` ones."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Whole-model comparisons on the int8 path: two implementations that differ by float rounding (1e-7) upstream of a
# linear can flip one activation's int8 rounding (1 LSB); random tiny weights amplify that to 1e-4..7e-3 (seen over
# many seeds). Exactness is checked layer by layer (identical outputs) and on the float path (<= 1e-6); this bound
# only has to catch real mistakes (wrong smoothing, scale or packing: relative errors of 1e-1 and more).
INT8_WHOLE_MODEL = 5e-2


def link_pack(folder: pathlib.Path) -> pathlib.Path:
    """``folder`` with this checkout linked in as the package ``comfyui_ideogram4_int8``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "comfyui_ideogram4_int8").symlink_to(ROOT)
    return folder


def run_nodes_check(check: str, pack_parent: pathlib.Path, work: pathlib.Path, gpu=False, drop_env=()) -> dict:
    """The check's RESULT (with ``__seed__``, a fresh one per run); ``drop_env``: variables it must not inherit."""
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"])
    python = os.environ.get("COMFYUI_PYTHON") or str(comfy_dir / ".venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", *drop_env)}  # conftest sets it here
    if gpu:
        env["COMFY_GPU"] = "1"
    seed = int.from_bytes(os.urandom(3), "little")
    script = str(ROOT / "tests" / "comfy_nodes_script.py")
    args = [python, script, str(comfy_dir), str(pack_parent), str(work), check, str(seed)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=work, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"seed {seed}: no result\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    res = json.loads(lines[-1][len("RESULT ") :])
    assert "__error__" not in res, f"seed {seed}:\n{res['__error__']}\n{out.stderr[-2000:]}"
    res["__seed__"] = seed
    return res


def run_nodes_check_on_gpu(tmp_path: pathlib.Path, check: str, drop_env: tuple[str, ...] = ()) -> dict:
    """``run_nodes_check`` with ComfyUI on the GPU(s); skips without a ComfyUI checkout."""
    if not os.environ.get("COMFYUI_DIR"):
        pytest.skip("needs a ComfyUI 0.33 checkout: set COMFYUI_DIR")
    return run_nodes_check(check, link_pack(tmp_path / "pack"), tmp_path, gpu=True, drop_env=drop_env)


def check_runner(tmp_path_factory):
    """``run(check)``: the RESULT of one check on the CPU, the pack linked once (a test module's ``run_check``)."""
    pack_parent = link_pack(tmp_path_factory.mktemp("pack"))

    def run(check: str) -> dict:
        return run_nodes_check(check, pack_parent, tmp_path_factory.mktemp(check))

    return run


def _cpu_paths() -> str:
    """How the loader's summary names the tiny W8A8 model's paths on a CPU (as the panel does, with the ids): its 23
    int8 layers on cublas-int8 (the suite pins that CPU answer) and 8 protected or top-level layers in float."""
    from comfyui_ideogram4_int8.kernels.path_choice import labels_here

    _, words = labels_here()
    return f"23 on {words['cublas-int8']} [cublas-int8], 8 on {words['bf16']} [bf16]"


CPU_PATHS = _cpu_paths()
