"""The first-use self-check (kernels/self_check.py) forced on this GPU (the repository's measured H100 / H200 run it
only when asked): every family this machine runs passes, its time is printed (a benchmark number, not an assertion),
and a kernel computing wrong results is demoted with its reason while the layer gives the twin's result."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch
from comfyui_ideogram4_int8 import kernels as K
from comfyui_ideogram4_int8.kernels import backends, fp8_gemm, gemm_triton, self_check, settings
from comfyui_ideogram4_int8.kernels.env import triton_version
from kernel_checks import activations, broken_launch_gemm, weight

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")


@pytest.fixture
def forced(setting, tmp_path):
    """The check forced on (sm_90 is measured: checked only then), its cache in a fresh folder, every verdict
    forgotten before and after; gives ``setting``."""
    setting.experiments("self-check=on")
    setting(settings.CACHE_DIR, str(tmp_path / "cache"))
    self_check.reset()
    yield setting
    self_check.reset()


def _ask_every_family() -> tuple[dict, float]:
    """Each backend's availability and the fp8 path's (a family's check runs on its first ask), and the wall time."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    why = {b: backends.unavailable(b, DEV) for b in ("gluon", "triton", "cublas")}
    why["fp8"] = fp8_gemm.fp8_unavailable(DEV)
    torch.cuda.synchronize()
    return why, time.perf_counter() - start


def test_the_self_check_forced_on_this_gpu_passes_and_a_later_process_reuses_it(forced, tmp_path, capsys):
    why, cold = _ask_every_family()
    found = {r["family"]: r for r in self_check.results(DEV)}
    assert {"triton", "cublas"} <= set(found), found  # the portable kernels and cuBLAS run on every sm_80+ GPU
    assert all(r["passed"] and r["why"] is None and not r["from_cache"] for r in found.values()), found
    assert all(why[family] is None for family in found), why
    per_family = ", ".join(f"{f} {r['seconds']:.2f} s" for f, r in found.items())
    # warm: the kernels compiled in this process, the verdicts forgotten, a fresh cache folder
    forced(settings.CACHE_DIR, str(tmp_path / "warm"))
    self_check.reset()
    _, warm = _ask_every_family()
    assert all(r["passed"] and not r["from_cache"] for r in self_check.results(DEV))
    # a later process: the first cache folder holds the passes
    forced(settings.CACHE_DIR, str(tmp_path / "cache"))
    self_check.reset()
    _, cached = _ask_every_family()
    assert {r["family"] for r in self_check.results(DEV) if r["from_cache"]} == set(found)
    with capsys.disabled():
        print(
            f"\nself-check forced on {torch.cuda.get_device_name()} (Triton {triton_version()}): "
            f"{cold:.2f} s cold (compiles included: {per_family}), {warm:.2f} s warm, {cached:.3f} s from the cache"
        )


def _cost(order: str, folder) -> dict:
    """tests/self_check_cost.py in a process of its own with an empty Triton cache."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(folder / "triton"), settings.CACHE_DIR: str(folder / "pack")}
    env[settings.EXPERIMENTS_VAR] = ",".join(e for e in (env.get(settings.EXPERIMENTS_VAR), "no-autotune") if e)
    script = pathlib.Path(__file__).resolve().parents[1] / "self_check_cost.py"
    out = subprocess.run([sys.executable, str(script), order], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_checks_compiles_are_the_ones_the_models_first_pass_needs(tmp_path, capsys):
    """Cold (an empty Triton cache): the check first, then Ideogram 4's calls at their real shapes; and the other
    way round. The check compiles nothing the model's calls have not compiled already (printed: each step's time and
    compile count, a benchmark record, not an assertion on time)."""
    first = _cost("check-first", tmp_path / "check-first")
    after = _cost("model-first", tmp_path / "model-first")
    assert after["check"]["compiled"] == [], after["check"]["compiled"]
    with capsys.disabled():
        print(
            f"\nself-check forced on {first['gpu']}, empty Triton cache, no autotuning: "
            f"check first {first['check']['seconds']:.2f} s ({len(first['check']['compiled'])} compiles; "
            + ", ".join(f"{f} {s:.2f} s" for f, s in first["families"].items())
            + f"), then the model's calls {first['model']['seconds']:.2f} s "
            f"({len(first['model']['compiled'])} compiles); the model's calls first {after['model']['seconds']:.2f} s "
            f"({len(after['model']['compiled'])} compiles), then the check {after['check']['seconds']:.2f} s "
            f"({len(after['check']['compiled'])} compiles)"
        )
        for name in first["model"]["compiled"]:
            print(f"  compiled by the model's calls after the check: {name[:200]}")


@pytest.mark.parametrize("fault, caught", [("epilogue scale", "dequant"), ("tile edge", "dequant")])
def test_a_kernel_computing_wrong_results_on_this_gpu_is_demoted_and_the_layer_equals_the_twin(
    fault, caught, forced, monkeypatch
):
    monkeypatch.setattr(gemm_triton, "launch_gemm", broken_launch_gemm(fault))
    why = backends.unavailable("triton", DEV)
    assert why is not None and "failed their self-check" in why and caught in why, why
    gen = torch.Generator().manual_seed(7)
    x = activations(100, 512, gen, torch.bfloat16, "cuda")
    w, ws = weight(256, 512, gen, "cuda")
    bias = (torch.randn(256, generator=gen) * 0.1).bfloat16().cuda()
    site = f"gpu/self-check {fault}"
    y = K.w8a8_linear(x, w, ws, bias, site=site)
    (rec,) = [r for r in K.REGISTRY.layers() if r.site == site]
    assert rec.path == K.PATH_CUBLAS and "failed their self-check" in rec.reason, (rec.path, rec.reason)
    q, s = K.quantize_per_token_ref(x)
    assert torch.equal(y, K.int8_matmul_ref(q, w, s, ws, bias, out_dtype=torch.bfloat16))
