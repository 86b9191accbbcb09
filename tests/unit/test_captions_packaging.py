"""The caption module's data files (schema, fixtures) and the web files are declared so a wheel ships them
(checked against pyproject.toml's globs; a wheel built from this tree was inspected the same way)."""

from __future__ import annotations

import fnmatch
import pathlib
import subprocess
import sys

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return data["packages"], data["package-data"]


def _shipped(rel: str, package_data: dict) -> bool:
    for pkg, globs in package_data.items():
        prefix = pkg.replace("comfyui_ideogram4_int8", "", 1).strip(".").replace(".", "/")
        prefix = prefix + "/" if prefix else ""
        if rel.startswith(prefix) and any(_glob_match(rel[len(prefix) :], g) for g in globs):
            return True
    return False


def _glob_match(rel: str, pattern: str) -> bool:
    """setuptools' package-data globs: '*' never crosses a '/' (unlike plain fnmatch)."""
    parts, pats = rel.split("/"), pattern.split("/")
    return len(parts) == len(pats) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pats, strict=True))


def test_every_package_folder_is_declared():
    """pyproject.toml names its packages one by one: a folder with an ``__init__.py`` missing there (a new
    subpackage) would import from a checkout and be left out of a wheel."""
    packages, _ = _package_data()
    tops = [d for d in ROOT.iterdir() if (d / "__init__.py").is_file() and d.name != "tests"]
    folders = {
        ".".join(("comfyui_ideogram4_int8", *init.parent.relative_to(ROOT).parts))
        for top in tops
        for init in top.rglob("__init__.py")
    }
    assert "comfyui_ideogram4_int8.nodes.runtime" in folders
    assert folders - set(packages) == set()


def test_caption_subpackage_and_data_files_are_declared():
    packages, package_data = _package_data()
    assert "comfyui_ideogram4_int8.ideogram4.captions" in packages
    needed = [p for p in (ROOT / "ideogram4" / "captions").rglob("*.json")]
    needed += [p for p in (ROOT / "web").rglob("*") if p.suffix in (".js", ".mjs")]
    assert any(p.name == "caption.schema.json" for p in needed)
    for path in needed:
        rel = path.relative_to(ROOT).as_posix()
        assert _shipped(rel, package_data), f"{rel} is not in [tool.setuptools.package-data]"


def test_caption_api_imports_without_jsonschema_until_used():
    code = (
        "import sys\n"
        "import comfyui_ideogram4_int8.ideogram4 as m\n"
        "assert callable(m.validate_caption) and callable(m.serialize_caption)\n"
        "assert 'jsonschema' not in sys.modules, 'jsonschema imported eagerly'\n"
        "assert not any(k == 'comfy' or k.startswith('comfy.') for k in sys.modules)\n"
        "assert m.validate_caption({'compositional_deconstruction': {'background': 'x', 'elements': []}}) == []\n"
        "assert 'jsonschema' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
