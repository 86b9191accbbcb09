"""The self-check launches the kernels Ideogram 4's own calls compile, nothing else (kernels/self_check_plan.py): the
same Triton compile keys on every device family, on small problems that still cross tile edges."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from comfyui_ideogram4_int8.kernels import backends, tuning
from comfyui_ideogram4_int8.kernels import configs as C
from comfyui_ideogram4_int8.kernels import self_check_plan as P

TESTS = pathlib.Path(__file__).resolve().parents[1]
H200 = P.Target("sm90", "NVIDIA H200", "3.6", 132, True, True)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict:
    """tests/self_check_keys.py's answer, from a process of its own (no interpreter: real compile keys)."""
    if backends.triton_import_error() is not None:
        pytest.skip(backends.triton_import_error())
    path = tmp_path_factory.mktemp("keys") / "keys.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, str(TESTS / "self_check_keys.py"), str(path)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return json.loads(path.read_text())


def test_on_every_family_the_check_compiles_exactly_the_kernels_the_models_calls_compile(keys):
    assert {"sm80 A100", "sm89 RTX 4090", "sm90 H100", "sm100 B200", "sm120 RTX 5090"} <= set(keys)
    for name, found in keys.items():
        check, model = set(found["check"]), set(found["model"])
        assert check == model, (name, sorted(check - model), sorted(model - check))
    if backends.gluon_import_error() is None:
        assert "gluon" in keys["sm90 H200, Triton 3.6, Gluon"]["families"]


def test_the_checks_earlier_problem_sizes_compiled_kernels_the_model_never_runs(keys):
    # the control: a key of a 144 x 512 quantizer, a raw int32 accumulator, a 2-program persistent kernel differs
    for name, found in keys.items():
        assert found["earlier"] and not set(found["earlier"]) & set(found["model"]), name


def test_on_the_h200_the_check_runs_the_shipped_picks_of_the_models_calls():
    cases = P.gemm_cases(H200)
    for call in P.MODEL_GEMMS:
        shipped = tuning.shipped_config("sm90", "NVIDIA H200", "3.6", call.m, call.key_n, call.k, call.epilogue)
        if shipped is not None:
            assert P.model_config(H200, call) == shipped[0], call
            assert any(c.cfg == shipped[0] for c in cases[shipped[0].backend]), call
    assert {c.cfg.kernel for c in cases["gluon"]} == {"gluon-ws", "gluon-pingpong"}
    # Gluon off: the portable twins, the persistent TMA kernels among them
    twins = P.gemm_cases(P.Target("sm90", "NVIDIA H200", "3.6", 132, False, True))
    assert not twins["gluon"] and "triton-tma" in {c.cfg.kernel for c in twins["triton"]}


@pytest.mark.parametrize("arch", ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"])
def test_without_a_known_pick_the_check_runs_the_heuristic_which_autotuning_compiles_too(arch):
    target = P.Target(arch, "a GPU nobody measured", "9.9", 100, False, arch in ("sm90", "sm100"))
    for call in P.MODEL_GEMMS:
        cfg = P.model_config(target, call)
        assert cfg in C.config_space(arch, call.m), (arch, call, cfg.key())
        if call.pair:
            assert cfg.problem(2, swiglu=True) is None


@pytest.mark.parametrize("sms", [132, 148])
def test_every_case_crosses_tile_edges_and_a_persistent_kernel_keeps_the_models_program_count(sms):
    for target in (P.Target("sm90", "NVIDIA H200", "3.6", sms, False, True), H200):
        cases = [c for cs in P.gemm_cases(target).values() for c in cs] + [P.fp8_case(target)]
        for case in cases:
            width = case.cfg.block_n // 2 if case.pair else case.cfg.block_n
            assert case.m == 1 or case.m % case.cfg.block_m, case.name()
            assert case.n % width and case.n % 16 == 0 and case.m * case.n * case.k < 2**30, case.name()
            assert case.k >= 2 * case.cfg.block_k * max(1, case.cfg.split_k), case.name()
            if case.cfg.kernel == "triton-tma":
                assert -(-case.m // case.cfg.block_m) * -(-case.n // width) >= sms, case.name()
