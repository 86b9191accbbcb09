"""Test-wide setup.

* Tests live in one folder per tier: ``unit/`` (CPU, no marker), ``cuda/`` (``cuda``), ``comfyui/`` (``comfyui``),
  ``browser/`` (``comfyui``, with chromium), ``js/`` (Node's test runner). The helper modules they share stay here,
  next to this file, which puts this folder on ``sys.path`` so every tier imports them by name. ``comfyui/`` is
  on it too: the browser tests drive the status test's server (``comfyui/test_status_comfyui.py``).
* Without a GPU the Triton kernels run on the CPU interpreter: TRITON_INTERPRET=1 must be set
  before triton compiles anything, so it is set here, before any test module imports kernels.
* `cuda` tests skip without a CUDA GPU; `comfyui` tests skip without COMFYUI_DIR.
* The pack reads its switches once (kernels/settings.py): every test starts from a fresh reading of the environment,
  and the ``setting`` fixture changes one and reads them again.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
# the checks comfy_nodes_script.py runs in ComfyUI's Python: importing them reads that script's command line
collect_ignore = ["comfy_checks"]
for _folder in (os.path.join(TESTS, "comfyui"), TESTS):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# On a CPU the automatic path depends on whether torch._int_mm measures fast there (kernels/cpu_gemm.py): the suite
# states the answer (int8: the cublas-int8 path the path tests expect) so its expectations do not depend on the CPU
# that runs it; tests of the measurement itself unset it. Subprocesses (ComfyUI, the demo) inherit it.
EXPERIMENTS = "IDEOGRAM4_INT8_EXPERIMENTS"
CPU_GEMM_PIN = "cpu-gemm=int8"
if "cpu-gemm" not in os.environ.get(EXPERIMENTS, ""):
    os.environ[EXPERIMENTS] = ",".join(e for e in (os.environ.get(EXPERIMENTS, ""), CPU_GEMM_PIN) if e)


_SESSION_TMP: str | None = None


def pytest_configure(config):
    global _SESSION_TMP
    _SESSION_TMP = tempfile.mkdtemp(prefix="ig4i8-tests-")
    os.environ["TMPDIR"] = _SESSION_TMP  # subprocesses (ComfyUI, node, chromium) and this process alike
    tempfile.tempdir = None  # re-read from TMPDIR on next use


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _SESSION_TMP and exitstatus not in (0, 5) and os.path.isdir(_SESSION_TMP):
        terminalreporter.write_line(f"temporary files of this session kept for inspection: {_SESSION_TMP}")


def pytest_unconfigure(config):
    server = sys.modules.get("comfyui_server")
    if server is not None and getattr(server, "_SHARED", None) is not None:
        server._SHARED.stop()  # before its base directory goes (its atexit hook would run later)
    status = getattr(config, "_ig4i8_exitstatus", 0)
    if _SESSION_TMP and status in (0, 5):
        shutil.rmtree(_SESSION_TMP, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    session.config._ig4i8_exitstatus = int(exitstatus)


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA (torch sees none here)")
    skip_comfy = pytest.mark.skip(reason="needs a ComfyUI 0.33 checkout: set COMFYUI_DIR")
    has_comfy = bool(os.environ.get("COMFYUI_DIR"))
    for item in items:
        if "cuda" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip_cuda)
        if "comfyui" in item.keywords and not has_comfy:
            item.add_marker(skip_comfy)


@pytest.fixture
def gen():
    """A fresh, differently seeded generator per test: kernels must be right on any data.

    Failure messages print ``gen.initial_seed()`` so a failing draw can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    return g


@pytest.fixture(autouse=True)
def _fresh_settings():
    """Each test reads the switches as the environment has them now (an earlier test's monkeypatch undone)."""
    from comfyui_ideogram4_int8.kernels import settings

    settings.reload()


@pytest.fixture
def setting(monkeypatch):
    """``setting(variable, value)``: set a pack switch (None: unset it) for this test and read the switches again;
    returns the new reading. ``setting.experiments(*entries)``: the experiments list, with the suite's CPU pin."""
    from comfyui_ideogram4_int8.kernels import settings

    def set_(name: str, value: str | None):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        return settings.reload()

    set_.experiments = lambda *entries: set_(EXPERIMENTS, ",".join((CPU_GEMM_PIN, *entries)))
    return set_
