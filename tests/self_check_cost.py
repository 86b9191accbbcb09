"""What the self-check costs on this GPU with an empty Triton cache, and whether it compiles anything Ideogram 4's own
calls do not: one process per order (the test runs it with a fresh TRITON_CACHE_DIR, the check forced on, no
autotuning), printing JSON.

    python tests/self_check_cost.py check-first|model-first

``check-first``: the check (every family this GPU runs), then the model's calls at their real shapes
(self_check_plan.MODEL_GEMMS, the fp8 w2 where that path runs); ``model-first``: the model's calls with the check
off, then the check. Per step: its wall time and the kernels Triton compiled during it (name and specialization).
Used by tests/cuda/test_self_check_gpu.py.
"""

from __future__ import annotations

import json
import sys
import time

import torch

DEV = torch.device("cuda")


def _jit_kernels() -> list:
    from comfyui_ideogram4_int8.kernels import gemm_gluon_kernel, gemm_triton_kernels, quant_triton

    out = []
    for module in (gemm_triton_kernels, quant_triton, gemm_gluon_kernel):
        out += [v for v in vars(module).values() if hasattr(v, "device_caches")]
    return out


def compiled() -> set:
    """(kernel, key) of every kernel this process compiled so far."""
    return {
        (kernel.fn.__name__, str(key))
        for kernel in _jit_kernels()
        for caches in kernel.device_caches.values()
        for key in caches[0]
    }


def model_pass() -> None:
    from comfyui_ideogram4_int8 import kernels as K
    from comfyui_ideogram4_int8.kernels import fp8_gemm
    from comfyui_ideogram4_int8.kernels import self_check_plan as P

    gen = torch.Generator(DEV).manual_seed(0)
    for call in P.MODEL_GEMMS:
        x = torch.randn(call.m, call.k, generator=gen, device=DEV).bfloat16()
        w = torch.randint(-127, 128, (call.n, call.k), generator=gen, device=DEV, dtype=torch.int8)
        ws = torch.rand(call.n, generator=gen, device=DEV) * 1e-3
        if call.pair:
            K.swiglu_w8a8_pair(x, w, ws, w.flip(0), ws.flip(0), site=f"cost/{call.name}")
        else:
            bias = torch.randn(call.n, generator=gen, device=DEV).bfloat16() if call.bias else None
            K.w8a8_linear(x, w, ws, bias, site=f"cost/{call.name}")
    if fp8_gemm.fp8_unavailable(DEV) is None:
        call = P.MODEL_FP8_GEMM
        x = torch.randn(call.m, call.k, generator=gen, device=DEV).bfloat16()
        w = torch.randn(call.n, call.k, generator=gen, device=DEV).to(fp8_gemm.FP8_CODES)
        K.fp8_linear(x, w, torch.tensor(1e-2, device=DEV), site=f"cost/{call.name}")
    torch.cuda.synchronize()


def check() -> None:
    from comfyui_ideogram4_int8.kernels import backends, fp8_gemm, self_check

    self_check.reset()
    for backend in ("gluon", "triton", "cublas"):
        backends.unavailable(backend, DEV)
    fp8_gemm.fp8_unavailable(DEV)
    torch.cuda.synchronize()
    failed = [r for r in self_check.results(DEV) if not r["passed"]]
    assert not failed, failed


def timed(step) -> dict:
    before = compiled()
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "compiled": sorted(f"{name} {key}" for name, key in compiled() - before)}


def main(order: str) -> None:
    import os

    from comfyui_ideogram4_int8.kernels import self_check, settings

    experiments = os.environ.get(settings.EXPERIMENTS_VAR, "")

    def check_set(mode: str) -> None:
        os.environ[settings.EXPERIMENTS_VAR] = f"{experiments},self-check={mode}"
        settings.reload()
        self_check.reset()

    torch.empty(1, device=DEV)  # the CUDA context, outside every step
    if order == "check-first":
        check_set("on")
        steps = {"check": timed(check), "model": timed(model_pass)}
    else:
        check_set("off")
        steps = {"model": timed(model_pass)}
        check_set("on")
        steps["check"] = timed(check)
    families = {r["family"]: r["seconds"] for r in self_check.results(DEV)}
    print(json.dumps({"order": order, "gpu": torch.cuda.get_device_name(), "families": families, **steps}))


if __name__ == "__main__":
    main(sys.argv[1])
