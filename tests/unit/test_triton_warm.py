"""kernels/triton_warm.py: Triton's per-process keys computed once, off the first pass."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from comfyui_ideogram4_int8.kernels import triton_warm  # noqa: E402

KERNELS = pathlib.Path(triton_warm.__file__).parent


def test_every_kernel_module_with_jit_functions_is_warmed():
    with_jit = {p.stem for p in KERNELS.glob("*.py") if re.search(r"^\s*@(triton|gluon)\.jit", p.read_text(), re.M)}
    assert with_jit <= set(triton_warm.KERNEL_MODULES), with_jit - set(triton_warm.KERNEL_MODULES)


def test_the_jit_functions_found_are_the_decorated_ones():
    # in a process of its own without the CPU interpreter (which makes every decorated function an interpreted one)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "from triton.runtime.jit import JITFunction\n"
        "from comfyui_ideogram4_int8.kernels import triton_warm as w\n"
        "found = w.jit_functions()\n"
        "assert all(isinstance(f, JITFunction) for f in found)\n"
        "print(' '.join(sorted({f.__name__ for f in found})))"
    )
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    names = set(run.stdout.split())
    for module in ("gemm_triton_kernels", "quant_triton", "qk_norm_rope_triton", "rms_modulate_triton"):
        text = (KERNELS / f"{module}.py").read_text()
        decorated = set(re.findall(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*\s*def (\w+)", text))
        assert decorated and decorated <= names, (module, decorated - names)


def test_warm_computes_the_version_key_once_and_every_source_key(monkeypatch):
    calls = []
    monkeypatch.setattr(triton_warm, "_triton_key", lambda: lambda: calls.append(1))
    found = triton_warm.jit_functions()
    for fn in found:
        monkeypatch.setattr(fn, "hash", None, raising=False)  # the property computes again
    out = triton_warm.warm()
    assert calls == [1] and out["keyed"] == len(found) and out["skipped"] == []
    assert all(isinstance(fn.cache_key, str) and fn.cache_key for fn in found)


def test_a_missing_version_key_is_said_not_raised(monkeypatch):
    monkeypatch.setattr(triton_warm, "_triton_key", lambda: None)
    out = triton_warm.warm()
    assert out["skipped"] and "triton_key" in out["skipped"][0]


def test_start_runs_once_per_process_and_not_without_cuda(monkeypatch):
    import torch

    ran = []
    monkeypatch.setattr(triton_warm, "_THREAD", None)
    monkeypatch.setattr(triton_warm, "_run", lambda: ran.append(1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert triton_warm.start() is None and ran == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    thread = triton_warm.start()
    assert thread is not None
    thread.join(10)
    assert ran == [1] and triton_warm.start() is None


def test_a_failing_warm_up_is_recorded_not_raised(monkeypatch):
    def boom():
        raise RuntimeError("no cache dir")

    monkeypatch.setattr(triton_warm, "warm", boom)
    monkeypatch.setattr(triton_warm, "RESULT", {})
    triton_warm._run()
    assert "no cache dir" in triton_warm.RESULT["error"]


def test_a_triton_that_fails_to_import_starts_nothing_and_raises_nothing(monkeypatch):
    import builtins

    import torch

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "triton":
            raise RuntimeError("libtriton.so: undefined symbol")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(triton_warm, "_THREAD", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(builtins, "__import__", broken)
    assert triton_warm.start() is None


def test_a_failing_version_key_still_keys_the_functions(monkeypatch):
    def key():
        raise OSError("libtriton.so unreadable")

    monkeypatch.setattr(triton_warm, "_triton_key", lambda: key)
    out = triton_warm.warm()
    assert out["skipped"] == ["triton_key: OSError"] and out["keyed"] == len(triton_warm.jit_functions())
