"""The benchmark modules (bench/, bench/comfy/, bench/probes/): each imports, their imports point one way (lazy ones
inside functions counted), the ComfyUI benchmark's report imports none of its runs, and the old module path runs the
package's command."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest
from import_graph import assert_no_cycle

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "comfyui_ideogram4_int8"
OPTIONAL = {"triton", "matplotlib"}  # third-party modules a probe or the plot may need, absent on some machines


def _modules() -> dict[str, pathlib.Path]:
    """{"bench.x.y": path} of every module under bench/ (a package named by its folder), and {"cli": path} of the
    root package's own modules, which start the benchmarks (the package's ``__init__`` left out: it imports none)."""
    out = {path.stem: path for path in sorted(ROOT.glob("*.py")) if path.name != "__init__.py"}
    for path in sorted((ROOT / "bench").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imported(name: str, path: pathlib.Path) -> set[str]:
    """The bench modules ``name`` imports anywhere in its file (relative or absolute)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = [part for part in package.split(".") if part]  # "": a module of the root package
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = (node.module or "").removeprefix(PACKAGE + ".")
            submodules = {f"{module}.{a.name}".lstrip(".") for a in node.names} & set(MODULES)  # "from . import x"
            found |= submodules or ({module} & set(MODULES))
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix(PACKAGE + ".") for a in node.names} & set(MODULES)
    return found - {name}


def test_every_bench_module_is_found():
    for name in ("bench.comfy.cli", "bench.comfy.report", "bench.report", "bench.e2e", "bench.probes.load_memory"):
        assert name in MODULES, name


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("bench")))
def test_each_bench_module_imports(name):
    try:
        importlib.import_module(f"{PACKAGE}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}")
        raise


def test_bench_modules_import_each_other_one_way():
    """No import circle among the benchmark modules and the root package's (the command line starts benchmarks),
    lazy imports inside functions included; the shared report imports no benchmark, the ComfyUI report none of the
    ComfyUI runs, and no product benchmark imports a probe."""
    edges = {m: _imported(m, p) for m, p in MODULES.items()}
    assert_no_cycle(edges)
    assert edges["bench.report"] == set()
    assert "bench.gemm" in edges["cli"] and "machine_info" in edges["bench.gemm"]  # the root's modules are in the graph
    assert edges["bench.comfy.report"] <= {"bench.report", "bench.kernel_table"}
    assert edges["bench.comfy.cli"] >= {"bench.comfy.inprocess", "bench.comfy.parent", "bench.comfy.child"}
    for m, imported in edges.items():
        if not m.startswith("bench.probes"):
            assert not {n for n in imported if n.startswith("bench.probes")}, m


def test_the_comfy_report_imports_alone():
    """Importing the ComfyUI benchmark's report (as a table test or a notebook does) brings in none of its runs."""
    code = (
        "import sys\n"
        f"import {PACKAGE}.bench.comfy.report\n"
        f"runs = [m for m in sys.modules if m.startswith('{PACKAGE}.bench.comfy.') and not m.endswith('.report')]\n"
        "print(runs)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_old_module_path_runs_the_packages_command():
    """``python -m ...bench.comfy_e2e`` (commands in committed results) runs ``python -m ...bench.comfy``."""
    from comfyui_ideogram4_int8.bench import comfy_e2e
    from comfyui_ideogram4_int8.bench.comfy import cli

    assert comfy_e2e.run is cli.run


def test_a_results_command_line_keeps_only_the_last_part_of_each_path():
    from comfyui_ideogram4_int8.bench import report

    argv = ["bench", "--quick", "--out", "/home/someone/runs/report.json", "--workdir=C:\\Users\\me\\i4\\", "-x"]
    assert report.shown_args(argv) == "bench --quick --out report.json --workdir=i4 -x"
    argv = ["--out", "../runs/r.json", "--dir", "~/i4", "--note=fp8 w/o protect", "--url=https://a.b/c", "/"]
    assert report.shown_args(argv) == "--out r.json --dir i4 --note=fp8 w/o protect --url=https://a.b/c /"
