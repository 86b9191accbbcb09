"""The install path: what ComfyUI-Manager (or a user by hand) installs into ComfyUI's environment never touches
torch, and the registry metadata passes comfy-cli's validation.

* CPU: requirements.txt names no torch-family package, and nothing it pulls in (the installed distributions'
  ``Requires-Dist``, followed transitively) requires one — so pip never has a reason to re-resolve the user's torch.
* ``comfyui`` (comfyui/test_install_path_comfyui.py): a dry run of ``pip install -r requirements.txt`` in ComfyUI's
  own environment (``--no-index``: no network) would install or change nothing torch-related.
* comfy-cli's ``comfy node validate`` is run where comfy-cli is installed (``COMFY_CLI``, a path to its ``comfy``
  executable; it is not a project dependency: install it in a throwaway venv).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import pathlib
import subprocess

import pytest
from packaging.requirements import Requirement
from requirement_names import TORCH_FAMILY, canon

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _requirements() -> list[Requirement]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]


def _closure(reqs: list[Requirement]) -> dict[str, list[str]]:
    """Installed distribution name -> the chain that pulls it in, for requirements.txt's transitive closure
    (markers evaluated for this interpreter, no extras)."""
    seen: dict[str, list[str]] = {}
    todo = [(r, []) for r in reqs]
    while todo:
        req, chain = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canon(req.name)
        if name in seen:
            continue
        seen[name] = [*chain, req.name]
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue  # not installed here: reported by the caller
        todo += [(Requirement(r), seen[name]) for r in dist.requires or []]
    return seen


def test_requirements_and_what_they_pull_in_never_require_torch():
    reqs = _requirements()
    assert reqs, "requirements.txt is empty"
    direct = {canon(r.name) for r in reqs}
    assert not {n for n in direct if TORCH_FAMILY.match(n)}, direct
    closure = _closure(reqs)
    missing = [n for n in closure if not _installed(n)]
    assert not missing, f"not installed here, cannot follow their dependencies: {missing}"
    torchy = {n: " -> ".join(chain) for n, chain in closure.items() if TORCH_FAMILY.match(n)}
    assert not torchy, torchy
    assert len(closure) > len(direct)  # the walk really followed dependencies


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
        return True
    except md.PackageNotFoundError:
        return False


def test_the_closure_walk_finds_a_torch_dependency_when_there_is_one():
    # this package itself (installed for the tests) does require torch: the walk must see it, with the chain
    closure = _closure([Requirement("pytest"), Requirement("comfyui-ideogram4-int8")])
    assert closure["torch"] == ["comfyui-ideogram4-int8", "torch"], closure.get("torch")
    assert "pluggy" in closure  # pytest's own dependency, found transitively


def test_comfy_cli_validates_the_registry_metadata():
    comfy = os.environ.get("COMFY_CLI")
    if not comfy:
        pytest.skip("set COMFY_CLI to comfy-cli's `comfy` executable (pip install comfy-cli in a throwaway venv)")
    out = subprocess.run(
        [comfy, "--skip-prompt", "--no-enable-telemetry", "node", "validate"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "All validation checks passed" in text and "Security warnings" not in text, text
