"""The pack installs, imports without ComfyUI, and keeps its dependency direction."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import tomllib
from comfyui_ideogram4_int8.cli import PROG
from import_graph import assert_no_cycle

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_has_no_side_effects():
    # A fresh interpreter: importing the pack and its ComfyUI-free parts must not import comfy,
    # initialise CUDA or open a socket.
    code = r"""
import socket, sys
def _no_net(*a, **k):
    raise AssertionError("network access at import")
socket.socket.connect = _no_net
socket.create_connection = _no_net
import comfyui_ideogram4_int8 as pack
import comfyui_ideogram4_int8.kernels, comfyui_ideogram4_int8.ideogram4
import torch
assert not any(m == "comfy" or m.startswith("comfy.") for m in sys.modules), "comfy imported"
assert not torch.cuda.is_initialized(), "CUDA initialised at import"
assert pack.WEB_DIRECTORY == "./web"
assert callable(pack.comfy_entrypoint)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_pyproject_metadata():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, comfy = data["project"], data["tool"]["comfy"]
    assert project["name"] == "comfyui-ideogram4-int8"
    assert any(d.startswith("torch") for d in project["dependencies"])
    # a torch pin would make pip replace the user's CUDA build
    torch_dep = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert "==" not in torch_dep and "<" not in torch_dep
    for key in ("PublisherId", "DisplayName", "Icon", "requires-comfyui"):
        assert comfy.get(key), key
    assert comfy["requires-comfyui"].startswith(">=0.33")
    markers = data["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} >= {"cuda", "comfyui"}
    assert "--strict-markers" in data["tool"]["pytest"]["ini_options"]["addopts"]
    assert project["urls"]["Repository"]


def test_requirements_never_install_torch():
    lines = [
        line.split("#")[0].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    names = {line.split(">")[0].split("=")[0].split("<")[0].strip().lower() for line in lines}
    assert not names & {"torch", "torchvision", "torchaudio", "torchsde"}
    assert {"safetensors", "jsonschema", "huggingface_hub", "pillow"} <= names


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            prefix = "." * node.level
            found.add(prefix + (node.module or ""))
    return found


def test_dependency_direction():
    """nodes -> ideogram4 -> kernels; only nodes/ (and the root entry point) import ComfyUI."""
    comfy_roots = ("comfy", "comfy_api", "comfy_extras", "folder_paths", "server", "nodes", "node_helpers")
    for pkg, banned_rel in (("kernels", ("..",)), ("ideogram4", ("..nodes", "..cli", "..bench"))):
        for path in (ROOT / pkg).rglob("*.py"):
            for name in _imports(path):
                assert not name.startswith(banned_rel), f"{path}: imports {name}"
                if not name.startswith("."):
                    assert name.split(".")[0] not in comfy_roots, f"{path}: imports ComfyUI module {name}"
                    assert not name.startswith("comfyui_ideogram4_int8.nodes"), f"{path}: {name}"
                    if pkg == "kernels":
                        assert not name.startswith("comfyui_ideogram4_int8.ideogram4"), f"{path}: {name}"


def test_runtime_never_imports_a_node_module():
    """Inside nodes/: node modules import nodes/runtime/, never the other way (lazy imports included)."""
    for path in (ROOT / "nodes" / "runtime").rglob("*.py"):
        for name in _imports(path):
            up_one = name.startswith("..") and not name.startswith("...")  # ``from .. import x``: nodes/ itself
            assert not up_one, f"{path}: imports {name}"
            if name.startswith("comfyui_ideogram4_int8.nodes"):
                assert name.startswith("comfyui_ideogram4_int8.nodes.runtime"), f"{path}: imports {name}"


def test_kernels_import_each_other_without_cycles():
    """Every import between kernels/ modules, lazy ones inside functions included, points one way."""
    mods = {p.stem: p for p in (ROOT / "kernels").glob("*.py")}
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    edges[m] |= {node.module.split(".")[0]} & set(mods)
                else:
                    edges[m] |= {a.name for a in node.names} & set(mods)
    assert_no_cycle(edges)
    assert edges["configs"] == set(), "configs.py is the leaf every kernel module reads"


def test_layout_exists():
    for folder in ("kernels", "ideogram4", "nodes", "web", "example_workflows", "tests", "bench"):
        assert (ROOT / folder).is_dir(), folder
    assert (ROOT / "LICENSE").is_file()


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in readme
    assert "test-command" in ci  # .ci/run extracts the command from the README, verbatim


def test_cli_help_lists_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "comfyui_ideogram4_int8", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for sub in ("demo", "bench", "info"):
        assert sub in out.stdout


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "comfyui_ideogram4_int8", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_cli_info_reports_versions_and_the_gemm_path_with_its_reason():
    import torch

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IDEOGRAM4_INT8_GEMM_PATH")}
    out = _cli("info", "--json", env=env)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["torch"] == torch.__version__ and "arch" in info
    assert info["gemm_path"] in ("triton-int8", "cublas-int8", "dequant-bf16") and info["gemm_path_reason"]
    assert info["backend"] and info["backend_reason"]
    if not torch.cuda.is_available():
        assert info["device"] == "cpu" and info["gemm_path"] == "cublas-int8"
        assert "CUDA GPU" in info["gemm_path_reason"] and info["backend"] == "torch._int_mm"
    text = _cli("info", env=env)
    assert text.returncode == 0, text.stderr
    assert f"GEMM path  {info['gemm_path']} on {info['device']}" in text.stdout
    assert info["gemm_path_reason"] in text.stdout and f"backend    {info['backend']}" in text.stdout
    forced = json.loads(_cli("info", "--json", env=dict(env, IDEOGRAM4_INT8_GEMM_PATH="dequant-bf16")).stdout)
    assert forced["gemm_path"] == "dequant-bf16" and "IDEOGRAM4_INT8_GEMM_PATH" in forced["gemm_path_reason"]
    assert f"attention  {info['attention']['path']}" in text.stdout and info["attention"]["reason"] in text.stdout


def test_cli_info_names_the_attention_path_and_why(monkeypatch, setting):
    import torch
    from comfyui_ideogram4_int8 import machine_info
    from comfyui_ideogram4_int8.kernels import attention_choice

    cpu = machine_info._attention_report(torch.device("cpu"))
    assert cpu == {"path": "comfyui", "reason": "ComfyUI's own on the CPU (the pack's serves CUDA)"}
    asked = []
    answer = attention_choice.Choice("int8", "the fastest within the bound", {"sdpa": 2.0, "int8": 1.0}, {})
    monkeypatch.setattr(attention_choice, "choose", lambda *a: asked.append(a) or answer)
    monkeypatch.setattr(attention_choice, "PRIORITY", object())
    cuda = torch.device("cuda", 0)
    got = machine_info._attention_report(cuda)
    assert got["path"] == "int8" and got["reason"] == answer.reason and got["ms"] == answer.ms
    assert asked == [(cuda, attention_choice.Shape(*machine_info.INFO_ATTENTION), torch.bfloat16)]
    setting("IDEOGRAM4_INT8_ATTENTION", "comfyui")
    assert machine_info._attention_report(cuda)["reason"] == "ComfyUI's own (IDEOGRAM4_INT8_ATTENTION=comfyui)"


@pytest.mark.parametrize(
    "args, option, choices",
    [
        (("demo", "--preset", "Fast 4"), "--preset", "'Quality 48', 'Default 20', 'Turbo 12'"),
        (("demo", "--device", "gpu"), "--device", "cpu, cuda, cuda:N"),
        (("demo", "--threads", "0"), "--threads", f"1..{os.cpu_count()}"),
        (("demo", "--threads", "1000"), "--threads", f"a whole number 1..{os.cpu_count()}, this machine's CPUs"),
        (("demo", "--seed", "x"), "--seed", "a whole number 0..18446744073709551615"),
        (("demo", "--seed", "99999999999999999999999"), "--seed", "0..18446744073709551615"),
        (("demo", "--seed", "-1"), "--seed", "0..18446744073709551615"),
        (("bench", "--sustained", "-5"), "--sustained", "a number >= 0"),
        (("bench", "--sustained", "nan"), "--sustained", "a number >= 0"),
        (("bogus",), "command", "info"),
    ],
)
def test_cli_mistakes_are_one_line_naming_the_option_and_its_choices(args, option, choices):
    out = _cli(*args)
    assert out.returncode == 2 and out.stdout == ""
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert option in out.stderr and choices in out.stderr, out.stderr


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").is_file(), reason="needs Linux's /proc and /sys")
@pytest.mark.parametrize("folder", ["/proc", "/sys", "/sys/not-there/demo"])
def test_cli_demo_refuses_a_folder_the_os_keeps_files_out_of_in_one_line(folder):
    # root passes os.access there, and the demo then ended in a traceback from the checkpoint writer
    out = _cli("demo", "--out", folder)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "argument --out" in out.stderr, out.stderr
    assert "cannot write files in" in out.stderr or "no permission" in out.stderr, out.stderr


# the demo's checkpoint writer waits a minute, so the Ctrl-C lands inside the demo's work however slow this machine
# is (the demo takes about two seconds: on a loaded machine it could end before the signal was sent); SIGINT gets
# Python's own handler back, as in a terminal (a suite started in the background by a shell inherits it ignored)
_SLOW_DEMO = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from comfyui_ideogram4_int8 import cli
from comfyui_ideogram4_int8.ideogram4 import demo
write = demo.write_w8a8
demo.write_w8a8 = lambda *a, **k: (time.sleep(60), write(*a, **k))[1]
sys.exit(cli.main(sys.argv[1:]))
"""


def test_cli_demo_ctrl_c_is_one_line_and_exit_status_130(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_DEMO, "demo", "--device", "cpu", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stdout.readline()  # printed once torch is loaded and the demo starts its work
        assert first.startswith("Ideogram 4 W8A8 demo:"), first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines() == [f"{PROG} demo: interrupted (Ctrl-C)"], err


def test_cli_demo_refuses_a_bad_seed_before_writing_anything(tmp_path):
    out = _cli("demo", "--out", str(tmp_path / "demo"), "--seed", str(2**64))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "demo").exists()


def test_the_test_server_script_without_comfyui_dir_prints_its_usage():
    env = {k: v for k, v in os.environ.items() if k != "COMFYUI_DIR"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "comfyui_server.py")], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.startswith("usage: COMFYUI_DIR=") and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_skipped_cuda_test_says_it_needs_a_cuda_gpu(monkeypatch):
    import conftest

    class Item:
        keywords, markers = {"cuda": True}, []

        def add_marker(self, marker):
            self.markers.append(marker)

    item = Item()
    monkeypatch.setattr(conftest, "_HAS_CUDA", False)
    conftest.pytest_collection_modifyitems(None, [item])
    (reason,) = [m.kwargs["reason"] for m in item.markers]
    assert "CUDA" in reason and "GPU" in reason and "device machine" not in reason, reason


def test_cli_device_cuda_without_a_gpu_is_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    out = _cli("demo", "--device", "cuda")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "argument --device" in out.stderr and "sees no CUDA GPU" in out.stderr


def test_demo_help_lists_the_presets_and_devices():
    from comfyui_ideogram4_int8.cli import PRESET_NAMES
    from comfyui_ideogram4_int8.ideogram4.schedule import PRESETS

    assert tuple(PRESETS) == PRESET_NAMES
    out = _cli("demo", "--help")
    assert out.returncode == 0, out.stderr
    flat = " ".join(out.stdout.split())
    for name in PRESET_NAMES:
        assert name in flat
    assert "cpu, cuda, cuda:N" in flat


def test_the_root_init_imports_as_a_bare_module_as_pytest_9_does_in_a_clone_folder_with_dashes(tmp_path):
    """git clones the repository into ``comfyui-ideogram4-int8``, no Python name: pytest 9 then sets the root up by
    importing its ``__init__.py`` as a bare module, and a relative import there made every test of the README's test
    command error. Imported that way it must load (WEB_DIRECTORY, the entry point) without the package's names; as
    the package it keeps them."""
    import importlib.util

    clone = tmp_path / "comfyui-ideogram4-int8"
    clone.mkdir()
    (clone / "__init__.py").write_text((ROOT / "__init__.py").read_text())
    spec = importlib.util.spec_from_file_location("__init__", clone / "__init__.py")
    bare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bare)
    assert bare.WEB_DIRECTORY == "./web" and callable(bare.comfy_entrypoint)
    assert not hasattr(bare, "__getattr__")
    import comfyui_ideogram4_int8 as pack

    assert pack.CheckpointError.__name__ == "CheckpointError"  # the lazy names, as the package


def test_the_interpreters_floating_point_warnings_are_filtered_there_only():
    """Triton's CPU interpreter evaluates masked-off lanes and both sides of tl.where in numpy, so the kernel tests
    raised 72 RuntimeWarnings (0 * inf, NaN-to-int casts, exp overflow) that said nothing about the product: the
    filter hides them, and only where the interpreter module itself raises them."""
    import re
    import warnings

    filters = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    runtime = [f.split(":") for f in filters if ":RuntimeWarning:" in f]
    assert runtime, "no filter for the interpreter's RuntimeWarnings"
    for action, message, _, module in runtime:
        assert action == "ignore" and module == r"triton\.runtime\.interpreter", module
        for seen in ("invalid value encountered in cast", "invalid value encountered in multiply"):
            assert re.match(message, seen)
        assert re.match(message, "overflow encountered in exp") and re.match(message, "overflow encountered in divide")
    # the module pattern keeps the same warning raised anywhere else visible
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        for action, message, _, module in runtime:
            warnings.filterwarnings(action, message, RuntimeWarning, module)
        warnings.warn_explicit(
            "overflow encountered in exp", RuntimeWarning, "x.py", 1, module="triton.runtime.interpreter"
        )
        warnings.warn_explicit(
            "overflow encountered in exp", RuntimeWarning, "x.py", 1, module="comfyui_ideogram4_int8.x"
        )
    assert [w.filename for w in caught] == ["x.py"] and len(caught) == 1
