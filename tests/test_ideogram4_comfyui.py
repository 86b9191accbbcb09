"""Our reference DiT against ComfyUI's native Ideogram4Transformer2DModel on identical tiny weights.

Runs in ComfyUI's own Python (COMFYUI_PYTHON, default COMFYUI_DIR/.venv/bin/python): fp32, CPU,
image-only, conditional and masked-conditional packing, three configs (incl. head_dim 256 with
the real MRoPE sections).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.comfyui
def test_forward_matches_comfyui_native(tmp_path):
    comfy_dir = pathlib.Path(os.environ["COMFYUI_DIR"])
    python = os.environ.get("COMFYUI_PYTHON") or str(comfy_dir / ".venv" / "bin" / "python")
    pack_parent = tmp_path / "pack"
    pack_parent.mkdir()
    (pack_parent / "comfyui_ideogram4_int8").symlink_to(ROOT)
    out = subprocess.run(
        [python, str(ROOT / "tests" / "comfy_parity_script.py"), str(comfy_dir), str(pack_parent),
         str(int.from_bytes(os.urandom(2), "little"))],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(results) == 9
    for case, r in results.items():
        assert r["rel_err"] <= 1e-4, f"{case}: rel err {r['rel_err']:.2e} vs ComfyUI native"
