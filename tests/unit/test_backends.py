"""The backend ladder on the CPU: availability from real import attempts, and per-shape demotion.

A failing faster backend must never fail the run: the call gives exactly what the next backend gives,
later calls of that shape go straight there, and the registry says why (the panel shows it)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends, env, gemm_triton, launch, tuning
from comfyui_ideogram4_int8.kernels import configs as C
from kernel_checks import activations, weight

needs_interpreter = pytest.mark.skipif(
    backends.unavailable("triton", torch.device("cpu")) is not None, reason="needs triton + TRITON_INTERPRET=1"
)


@pytest.fixture
def fresh_backends():
    """Import checks are cached per process: clear them around a test that fakes the environment."""
    caches = (
        backends.triton_import_error,
        backends.gluon_import_error,
        backends._gluon_unavailable,
        launch.fast_launch_unavailable,
        env.triton_version,
    )
    for c in caches:
        c.cache_clear()
    backends.DEMOTIONS.clear()
    tuning.PICKER.clear()
    yield
    for c in caches:
        c.cache_clear()
    backends.DEMOTIONS.clear()
    tuning.PICKER.clear()


def test_missing_triton_is_a_reason_not_an_error(fresh_backends, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    why = backends.triton_import_error()
    assert "not installed" in why
    assert backends.gluon_import_error() == why
    assert K.select_path(torch.device("cpu"), 64, 64)[0] == "cublas-int8"


@pytest.mark.parametrize("version", ["3.2.0", "3.3.1"])
def test_too_old_triton_is_named(fresh_backends, monkeypatch, version):
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    why = backends.triton_import_error()
    assert why and version in why and "3.4" in why


@pytest.mark.parametrize("version", ["3.5.1", "3.7.1", "3.9.0"])
def test_gluon_and_cached_launches_run_only_on_the_triton_lines_they_are_checked_on(
    fresh_backends, monkeypatch, version
):
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    why = backends.gluon_import_error()
    assert why and version in why and "portable Triton kernel" in why
    assert version[:3] in launch.fast_launch_unavailable()


@needs_interpreter
def test_launcher_relaunches_a_cached_compiled_kernel_and_falls_back_when_it_breaks(monkeypatch):
    calls = []

    class Compiled:
        def __getitem__(self, grid):
            def runner(*params):
                calls.append(("cached", grid, params))
                if params[0] == "break":
                    raise RuntimeError("launcher ABI changed")

            return runner

    class Jit:
        arg_names = ("x", "n", "BLOCK")

        def __getitem__(self, grid):
            return lambda *a, **k: calls.append(("jit", grid, a, k)) or Compiled()

    monkeypatch.setattr(launch, "_STATE", {"disabled": None})
    monkeypatch.setattr(launch, "fast_launch_unavailable", lambda: None)
    lc = launch.Launcher(Jit())
    t = torch.zeros(4)
    lc((2,), (t, 16), {"BLOCK": 32, "num_warps": 4})
    lc((2,), (t, 16), {"BLOCK": 32, "num_warps": 4})
    assert [c[0] for c in calls] == ["jit", "cached"] and calls[1][1] == (2, 1, 1) and calls[1][2] == (t, 16, 32)
    lc((2,), (t, 17), {"BLOCK": 32, "num_warps": 4})  # another scalar: another signature, through kernel[grid]
    assert calls[-1][0] == "jit" and lc.cached_launches == 1
    lc((3,), ("break", 1), {"BLOCK": 32, "num_warps": 4})
    lc((3,), ("break", 1), {"BLOCK": 32, "num_warps": 4})  # the cached path raises: turned off, relaunched
    assert [c[0] for c in calls[-2:]] == ["cached", "jit"] and "launcher ABI changed" in launch.status()
    lc((2,), (t, 16), {"BLOCK": 32, "num_warps": 4})
    assert calls[-1][0] == "jit"


def test_gluon_switch_and_device_reasons(setting):
    from comfyui_ideogram4_int8.kernels import settings

    setting(settings.GLUON, "off")
    assert f"{settings.GLUON} is off" in backends.unavailable("gluon", torch.device("cuda"))
    setting(settings.GLUON, None)
    assert "CUDA" in backends.unavailable("gluon", torch.device("cpu"))


@needs_interpreter
@pytest.mark.parametrize("entry", ["w8a8_linear", "swiglu_w8a8_pair"])
def test_portable_failure_demotes_the_shape_to_cublas_exactly(fresh_backends, gen, monkeypatch, entry):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("test: PTX assembly failed\nptxas fatal: unresolved symbol")

    m, k = 9, 96
    x = activations(m, k, gen)
    if entry == "w8a8_linear":
        w, ws = weight(40, k, gen)
        bias = torch.randn(40, generator=gen).bfloat16()

        def run(path, site):
            return K.w8a8_linear(x, w, ws, bias, path=path, site=site)
    else:
        (w1, s1), (w3, s3) = weight(32, k, gen), weight(32, k, gen)

        def run(path, site):
            return K.swiglu_w8a8_pair(x, w1, s1, w3, s3, path=path, site=site)

    expected = run("cublas-int8", "demote/ref")
    monkeypatch.setattr(gemm_triton, "launch_gemm", broken)
    for i in range(3):
        y = run("triton-int8", f"demote/{entry}")
        assert torch.equal(y, expected), f"call {i}, seed {gen.initial_seed()}"
    assert len(calls) == 1, "the failing kernel must be tried once per shape, not on every call"
    rec = next(r for r in K.REGISTRY.layers("demote") if r.layer == entry)
    assert rec.path == "cublas-int8" and "fused Triton kernel failed" in rec.reason and "ptxas fatal" in rec.reason
    (demoted,) = backends.DEMOTIONS.items()
    assert demoted["backend"] == "triton" and "RuntimeError" in demoted["reason"]


@needs_interpreter
def test_the_fallback_after_a_fused_failure_is_the_path_choice(fresh_backends, gen, monkeypatch, setting):
    """The path after a failing fused kernel comes from the path choice's rules, not a fixed next rung: on a CPU
    where the float matmul measured faster than torch._int_mm, the automatic choice (dequant-bf16) runs, not
    cublas-int8, and the reason leads with the failure, then why cublas-int8 did not run."""
    from comfyui_ideogram4_int8.kernels import path_choice, settings

    setting(settings.EXPERIMENTS_VAR, "cpu-gemm=float")
    monkeypatch.setattr(gemm_triton, "launch_gemm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    x = activations(9, 96, gen)
    w, ws = weight(40, 96, gen)
    auto = K.select_path(x.device, 40, 96)
    assert auto[0] == "dequant-bf16"
    y = K.w8a8_linear(x, w, ws, path="triton-int8", site="fallback/x")
    rec = next(r for r in K.REGISTRY.layers("fallback") if r.layer == "x")
    assert rec.path == auto[0] and rec.reason.startswith("the fused Triton kernel failed for this shape: ")
    assert "boom" in rec.reason and "cpu-gemm=float" in rec.reason
    assert torch.equal(y, K.w8a8_linear(x, w, ws, path="dequant-bf16", site="fallback/ref"))
    setting(settings.EXPERIMENTS_VAR, "cpu-gemm=int8")  # where torch._int_mm is the fast CPU path: cublas-int8
    path, reason = path_choice.select_after_fused_failure(x.device, 40, 96, RuntimeError("boom"))
    assert path == "cublas-int8"
    # the failure first, then what picked cublas-int8 over the float matmul (here the suite's pin)
    assert reason == (
        "the fused Triton kernel failed for this shape: boom; "
        f"{settings.EXPERIMENTS_VAR} has cpu-gemm=int8 (stated, not measured), so it runs"
    )


@needs_interpreter
def test_int8_matmul_is_strict_about_a_failing_kernel(fresh_backends, gen, monkeypatch):
    monkeypatch.setattr(gemm_triton, "launch_gemm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    q, w = torch.randint(-127, 128, (5, 64), dtype=torch.int8, generator=gen), torch.ones(16, 64, dtype=torch.int8)
    with pytest.raises(K.GemmPathUnavailable, match="failed for this shape.*boom"):
        K.int8_matmul_int32(q, w)


@needs_interpreter
def test_a_gluon_pick_where_gluon_cannot_run_runs_its_portable_twin_and_says_so(fresh_backends, gen, monkeypatch):
    pick = C.GemmConfig("gluon-pingpong", 128, 128, 128, num_stages=5)
    monkeypatch.setattr(tuning.PICKER, "pick", lambda *a, **kw: (pick, "test pin"))
    x = activations(7, 64, gen)
    w, ws = weight(48, 64, gen)
    y = K.w8a8_linear(x, w, ws, path="triton-int8", site="twin/x")
    assert torch.equal(y, K.w8a8_linear(x, w, ws, path="cublas-int8", site="twin/ref"))
    rec = next(r for r in K.REGISTRY.layers("twin") if r.layer == "x")
    assert rec.path == "triton-int8" and rec.config == C.portable_twin(pick).key()
    assert rec.config_source.startswith("test pin; the Gluon kernels need a CUDA device")
