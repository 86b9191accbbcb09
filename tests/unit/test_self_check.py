"""The first-use self-check (kernels/self_check.py) on the CPU: where it runs, that the real kernels pass it on the
Triton interpreter, that a kernel computing wrong results is demoted with its reason while the layer still gives the
twin's result, and the cache that lets a later process skip it."""

from __future__ import annotations

import logging

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends, env, fp8_gemm, gemm_triton, self_check, self_check_plan, settings
from kernel_checks import activations, broken_launch_gemm, launches, weight

CPU = torch.device("cpu")
needs_interpreter = pytest.mark.skipif(
    backends.triton_import_error() is not None or not env.interpreter_mode(), reason="needs triton + TRITON_INTERPRET=1"
)


@pytest.fixture
def forced(setting, tmp_path):
    """The check forced on (the interpreter is checked only then), its cache in a fresh folder; every verdict
    forgotten before and after, so no other test sees a demotion."""
    setting.experiments("self-check=on")
    setting(settings.CACHE_DIR, str(tmp_path))
    self_check.reset()
    yield tmp_path
    self_check.reset()


@pytest.mark.parametrize(
    "arch, mode, checked",
    [
        ("sm120", "auto", True),
        ("sm100", "auto", True),
        ("sm89", "auto", True),
        ("sm80", "auto", True),
        ("sm90", "auto", False),  # measured in this repository
        ("sm90", "on", True),  # ... unless opted in
        ("sm120", "off", False),
    ],
)
def test_the_check_runs_on_the_families_this_repository_has_not_measured(arch, mode, checked):
    why = self_check.policy(arch, mode)
    assert (why is not None) == checked
    if checked:
        assert arch in why


@pytest.mark.parametrize(
    "entries, mode",
    [(("self-check=on",), "on"), (("self-check=off",), "off"), ((), "auto"), (("self-check=1",), "auto")],
)
def test_one_experiment_turns_it_on_or_off(entries, mode, setting):
    reading = setting.experiments(*entries)
    assert self_check.setting() == mode
    if entries == ("self-check=1",):  # not understood: named in a warning, the default kept
        assert "self-check takes self-check=on|off" in reading.problems[settings.EXPERIMENTS_VAR]


def test_nothing_is_checked_on_the_cpu_unless_forced(setting):
    setting.experiments()
    self_check.reset()
    try:
        assert self_check.applies(CPU) is None
        assert self_check.verdict("triton", CPU) is None and self_check.results(CPU) == []
    finally:
        self_check.reset()


@needs_interpreter
def test_the_real_kernels_pass_their_self_check_on_the_interpreter(forced):
    assert backends.unavailable("triton", CPU) is None
    assert fp8_gemm.fp8_unavailable(CPU) is None
    assert backends.unavailable("cublas", CPU) is None
    found = {r["family"]: r for r in self_check.results(CPU)}
    assert set(found) == {"triton", "fp8", "cublas"}
    assert all(r["passed"] and r["why"] is None and not r["from_cache"] for r in found.values())
    assert backends.report()["self_check"] == self_check.results(CPU)


@needs_interpreter
@pytest.mark.parametrize(
    "fault, caught",
    [
        ("epilogue scale", "dequant ("),
        ("tile edge", "dequant ("),
        ("SwiGLU pair", "SwiGLU pair"),
        ("accumulator off by one", "int32 accumulators"),
    ],
)
def test_a_kernel_that_computes_wrong_results_is_demoted_and_the_layer_gives_the_twins_result(
    fault, caught, forced, monkeypatch, gen, caplog
):
    monkeypatch.setattr(gemm_triton, "launch_gemm", broken_launch_gemm(fault))
    with caplog.at_level(logging.WARNING, logger="comfyui_ideogram4_int8.kernels.self_check"):
        why = backends.unavailable("triton", CPU)
    assert why is not None and "failed their self-check" in why and caught in why, why
    assert any(caught in rec.getMessage() and "demoted" in rec.getMessage() for rec in caplog.records)
    (found,) = [r for r in self_check.results(CPU) if r["family"] == "triton"]
    assert not found["passed"] and caught in found["why"]
    # every Triton kernel of the family is off on this device: the quantizer runs its twin, the fp8 path runs float
    x = activations(7, 64, gen)
    before = launches("quant_twin")
    q, s = K.quantize_per_token(x)
    assert launches("quant_twin") == before + 1
    qr, sr = K.quantize_per_token_ref(x)
    assert torch.equal(q, qr) and torch.equal(s, sr)
    assert fp8_gemm.select_fp8_path(CPU)[0] == K.PATH_BF16
    # a forced fused path says why it cannot run; the automatic one gives the twin's result
    w, ws = weight(48, 64, gen)
    bias = torch.randn(48, generator=gen)
    with pytest.raises(K.GemmPathUnavailable, match="self-check"):
        K.w8a8_linear(x, w, ws, bias, path="triton-int8")
    y = K.w8a8_linear(x, w, ws, bias, site="test/self-check")
    assert torch.equal(y, K.int8_matmul_ref(qr, w, sr, ws, bias, out_dtype=torch.float32))
    assert K.REGISTRY.path_of("test/self-check") == K.PATH_CUBLAS  # the suite's CPU answer (conftest)


@needs_interpreter
def test_a_pass_is_reused_from_the_cache_and_a_failure_is_checked_again(forced, monkeypatch):
    assert backends.unavailable("triton", CPU) is None  # runs and stores the pass
    self_check.reset()

    def must_not_run(device):
        raise AssertionError("the cached pass was not used")

    monkeypatch.setitem(self_check._CHECKS, "triton", must_not_run)
    assert backends.unavailable("triton", CPU) is None
    assert [r["from_cache"] for r in self_check.results(CPU) if r["family"] == "triton"] == [True]
    # another Triton: the stored pass says nothing about it
    monkeypatch.setattr(self_check, "triton_version", lambda: "9.9.9")
    self_check.reset()
    why = backends.unavailable("triton", CPU)
    assert why is not None and "the cached pass was not used" in why
    # that failure is not stored: the next process checks again
    monkeypatch.setitem(self_check._CHECKS, "triton", lambda device: None)
    self_check.reset()
    assert backends.unavailable("triton", CPU) is None
    assert [r["from_cache"] for r in self_check.results(CPU) if r["family"] == "triton"] == [False]


@needs_interpreter
def test_a_pass_stored_for_other_launches_is_checked_again(forced, monkeypatch):
    # the launches follow the model's picks, which autotuning may change: a stored pass covers the ones it made
    monkeypatch.setitem(self_check._CHECKS, "triton", lambda device: None)
    assert backends.unavailable("triton", CPU) is None
    self_check.reset()
    runs = []
    monkeypatch.setitem(self_check._CHECKS, "triton", runs.append)
    assert backends.unavailable("triton", CPU) is None and runs == []  # the same launches: the stored pass
    self_check.reset()
    monkeypatch.setattr(self_check_plan, "digest", lambda target, family: "other launches")
    assert backends.unavailable("triton", CPU) is None and runs == [CPU]
    assert [r["from_cache"] for r in self_check.results(CPU) if r["family"] == "triton"] == [False]


def test_the_cache_key_names_the_gpu_driver_torch_triton_and_kernel_sources():
    base = dict(gpu="NVIDIA GeForce RTX 5090 sm_120", driver="580.65", torch_version="2.13.0", triton="3.9.0")
    key = self_check.cache_key(**base, kernels="0123abcd")
    assert self_check.cache_key(**base, kernels="0123abcd") == key
    for field, other in (
        ("gpu", "NVIDIA GeForce RTX 4090 sm_89"),
        ("driver", "575.51"),
        ("torch_version", "2.12.0"),
        ("triton", "3.8.0"),
    ):
        assert self_check.cache_key(**{**base, field: other}, kernels="0123abcd") != key, field
    assert self_check.cache_key(**base, kernels="fedc3210") != key
    digest = self_check.kernel_sources_digest()
    assert len(digest) == 16 and digest == self_check.kernel_sources_digest()
    assert self_check.device_cache_key(CPU).endswith(f"kernels {digest}")


def test_an_unknown_family_is_refused_by_name():
    with pytest.raises(ValueError, match="self-check family 'tpu'"):
        self_check.verdict("tpu", CPU)
