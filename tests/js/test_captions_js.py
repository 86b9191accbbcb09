"""The JS editor's logic (web/lib/*.mjs) under Node's built-in test runner, and the Python side of the shared
box fixture: both must produce the same elements."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest
from caption_fixtures import load
from comfyui_ideogram4_int8.ideogram4.captions.builder import elements_from_boxes

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", load("box_elements.json")["cases"], ids=lambda c: c["note"][:40])
def test_python_side_of_the_shared_box_fixture(case):
    out = elements_from_boxes(case["boxes"], case["width"], case["height"])
    assert list(out.elements) == case["elements"]
    assert [list(e) for e in out.elements] == [list(e) for e in case["elements"]]  # key order too


def test_js_logic_tests_pass_under_node():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH (CI has Node 20)")
    files = sorted(str(p) for p in (ROOT / "tests" / "js").glob("*.test.mjs"))
    assert files, "no JS tests found"
    out = subprocess.run([node, "--test", *files], cwd=ROOT, capture_output=True, text=True, timeout=120)
    tail = (out.stdout + out.stderr)[-4000:]
    assert out.returncode == 0, tail
    assert "# fail 0" in out.stdout and "# pass " in out.stdout, tail
    passed = int(out.stdout.split("# pass ", 1)[1].split()[0])
    assert passed >= 20, tail


def test_every_js_file_under_web_is_an_es_module_entry_and_logic_is_in_mjs():
    # The frontend imports every .js under web/ as an extension; pure logic stays in .mjs (not auto-loaded).
    js = sorted(p.relative_to(ROOT / "web").as_posix() for p in (ROOT / "web").rglob("*.js"))
    assert "ideogram4_captions.js" in js
    assert (ROOT / "web" / "lib" / "bbox.mjs").is_file()


def test_extension_entry_parses_as_an_es_module(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH (CI has Node 20)")
    checked = []
    for src in (ROOT / "web").rglob("*.js"):
        copy = tmp_path / (src.stem + ".mjs")  # .mjs: parsed as a module; --check does not resolve imports
        copy.write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
        out = subprocess.run([node, "--check", str(copy)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stderr == "", f"{src}: {out.stderr}"
        checked.append(src.name)
    assert {"ideogram4_captions.js", "ideogram4_gemm_panel.js"} <= set(checked), checked
    # the check really parses: the same entry with a syntax error appended is refused, naming it
    broken = tmp_path / "broken.mjs"
    broken.write_text((ROOT / "web" / "ideogram4_captions.js").read_text(encoding="utf-8") + "\nconst = ;\n")
    out = subprocess.run([node, "--check", str(broken)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "SyntaxError" in out.stderr, out.stderr
