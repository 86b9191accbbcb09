"""The GEMM-path panel's JavaScript: Node's built-in test runner on tests/js/gemm_status.test.mjs,
and the panel logic fed with a report Python built from a real run (so the two sides cannot drift).

Skipped when ``node`` (>= 18) is not on PATH; CI has Node 20.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import panel_model
import pytest
from comfyui_ideogram4_int8.kernels import PATHS, model_notes
from comfyui_ideogram4_int8.kernels.path_choice import ENV_PATH
from comfyui_ideogram4_int8.nodes import status_report as status

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not on PATH (CI has Node 20)")


def _node_major() -> int:
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True, timeout=30)
    return int(out.stdout.strip().lstrip("v").split(".")[0])


def test_panel_logic_node_tests():
    if _node_major() < 18:
        pytest.skip("node --test needs Node 18+")
    out = subprocess.run(
        [NODE, "--test", "tests/js/gemm_status.test.mjs"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "# fail 0" in out.stdout and "# pass " in out.stdout, out.stdout[-4000:]
    assert int(out.stdout.split("# pass ", 1)[1].split()[0]) > 0, out.stdout[-4000:]  # tests ran, not none


def test_web_entry_imports_only_what_the_lib_exports():
    """The entry file is only loaded by the browser: check its named imports exist in the lib."""
    entry = (ROOT / "web" / "ideogram4_gemm_panel.js").read_text()
    block = entry.split('from "./lib/gemm_status.mjs"')[0].rsplit("import {", 1)[1].split("}")[0]
    names = [n.strip() for n in block.split(",") if n.strip()]
    script = (
        "const m = await import(process.argv[1]);"
        f"const missing = {json.dumps(names)}.filter((n) => !(n in m));"
        "console.log(JSON.stringify(missing));"
    )
    lib = (ROOT / "web" / "lib" / "gemm_status.mjs").as_uri()
    out = subprocess.run([NODE, "--input-type=module", "-e", script, lib], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [], "web/ideogram4_gemm_panel.js imports names gemm_status.mjs lacks"
    # helpers must stay .mjs: the frontend imports every .js under web/ as an extension entry
    assert not list((ROOT / "web" / "lib").rglob("*.js"))


@pytest.fixture
def real_report(tmp_path, setting, gen):
    setting(ENV_PATH, None)
    model_notes.forget()
    # real models from a synthetic checkpoint (tests/panel_model.py): conditional on the automatic path,
    # unconditional with the phantom-INT8 fallback forced
    panel_model.load_and_run(tmp_path, gen.initial_seed(), branches=("conditional",), steps=1)
    setting(ENV_PATH, "dequant-bf16")
    panel_model.load_and_run(tmp_path, gen.initial_seed(), branches=("unconditional",), steps=1)
    report = status.status_report()
    model_notes.forget()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return report, path


def test_panel_logic_reads_a_real_report(real_report):
    report, path = real_report
    lib = (ROOT / "web" / "lib" / "gemm_status.mjs").as_uri()
    script = (
        "import { readFileSync } from 'node:fs';"
        "const m = await import(process.argv[1]);"
        "const r = JSON.parse(readFileSync(process.argv[2], 'utf8'));"
        "const out = { check: m.checkReport(r), models: r.models.map(m.summarizeModel),"
        "  banner: m.statusBanner(r), badge: m.badgeFor(r), badgeCond: m.badgeFor(r, ['conditional']),"
        "  rows: r.models.map((x) => m.layerRows(x).length) };"
        "console.log(JSON.stringify(out));"
    )
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script, lib, str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    js = json.loads(out.stdout)
    assert js["check"] is None
    cond, unc = report["models"]
    s_cond, s_unc = js["models"]
    auto = next(p for p in PATHS if cond["counts"][p] and p != "bf16")
    quant = cond["counts"][auto]
    assert s_cond["headline"].startswith(f"conditional: {quant}/{cond['layers_total']} linears on ")
    assert s_cond["headline"].endswith(f" · {cond['counts']['bf16']} bf16-protected")
    assert s_cond["severity"] == ("ok" if auto == "triton-int8" else "notice")
    n_dq = unc["counts"]["dequant-bf16"]
    assert s_unc["headline"].startswith(f"unconditional: {n_dq}/{unc['layers_total']} linears dequantized to bf16")
    assert s_unc["severity"] == "warning"
    assert "IDEOGRAM4_INT8_GEMM_PATH=dequant-bf16" in s_unc["warning"]
    assert js["banner"]["severity"] in ("warning", "notice")  # notice when the status is "no_cuda"
    assert js["badge"]["severity"] == "warning"
    assert js["badgeCond"]["severity"] == s_cond["severity"]
    assert js["rows"] == [cond["layers_total"], unc["layers_total"]]


def test_web_entry_parses_as_an_es_module(tmp_path):
    """The browser loads the entry as an ES module; a syntax error would only show in the browser."""
    copy = tmp_path / "entry.mjs"  # .mjs: node parses it as a module without a package.json
    copy.write_text((ROOT / "web" / "ideogram4_gemm_panel.js").read_text())
    out = subprocess.run([NODE, "--check", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    # the check really parses: the same entry with a syntax error appended is refused, naming it
    copy.write_text(copy.read_text() + "\nconst = ;\n")
    out = subprocess.run([NODE, "--check", str(copy)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "SyntaxError" in out.stderr, out.stderr
