"""The Triton compile keys of the self-check's launches and of Ideogram 4's own calls, per device family, without a
GPU (in a process of its own: not on the CPU interpreter, whose kernels have no compile key).

    python tests/self_check_keys.py FILE.json

The check (kernels/self_check.py) runs with a launcher that records instead of launching and a comparison that
always agrees (so every case runs), on a stand-in device (``self_check_plan.target_of``); the model's calls are
built by the same host code at their real shapes (``self_check_plan.MODEL_GEMMS``, ``MODEL_QUANT_ROWS``,
``MODEL_FP8_GEMM``) from CPU tensors, with the configs the plan says they pick. A key is what
``JITFunction.run`` caches a compiled kernel under: the kernel, its specialization (the binder that
``create_function_from_signature`` builds for the target's backend) and its launch options. Written to FILE: per
target, the check's keys, the model's keys, and the keys of the check's earlier problem sizes (a control: they
must differ from the model's). Used by tests/unit/test_self_check_plan.py.
"""

from __future__ import annotations

import json
import sys

import torch

STAND_INS = (  # (name, compute capability, Target fields)
    ("sm80 A100", 80, ("sm80", "NVIDIA A100-SXM4-80GB", None, 108, False, False)),
    ("sm86 RTX 3090", 86, ("sm86", "NVIDIA GeForce RTX 3090", None, 82, False, False)),
    ("sm89 RTX 4090", 89, ("sm89", "NVIDIA GeForce RTX 4090", None, 128, False, False)),
    ("sm90 H200, Triton 3.6, Gluon", 90, ("sm90", "NVIDIA H200", "3.6", 132, True, True)),
    ("sm90 H200, Triton 3.6, Gluon off", 90, ("sm90", "NVIDIA H200", "3.6", 132, False, True)),
    ("sm90 H100", 90, ("sm90", "NVIDIA H100 80GB HBM3", None, 132, False, True)),
    ("sm100 B200", 100, ("sm100", "NVIDIA B200", None, 148, False, True)),
    ("sm120 RTX 5090", 120, ("sm120", "NVIDIA GeForce RTX 5090", None, 170, False, False)),
)


def compile_key(kernel, args, kwargs, cc: int) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(GPUTarget("cuda", cc, 32))
    _, spec, options = create_function_from_signature(kernel.signature, kernel.params, backend)(*args, **kwargs)
    return f"{kernel.fn.__name__} {spec} {sorted(options.items())}"


def _gemm_operands(m, n, k, codes=torch.int8, bias=False):
    q, w = torch.empty(m, k, dtype=codes), torch.empty(n, k, dtype=codes)
    return q, w, torch.empty(m), torch.empty(n), torch.empty(n).bfloat16() if bias else None


def model_launches(target, cc: int, families) -> list:
    """(kernel, args, kwargs) of the model's calls on ``target``: the families' GEMMs, their quantizations."""
    from comfyui_ideogram4_int8.kernels import fp8_gemm
    from comfyui_ideogram4_int8.kernels import gemm_triton as T
    from comfyui_ideogram4_int8.kernels import quant_triton as Q
    from comfyui_ideogram4_int8.kernels import self_check_plan as P

    out = []
    for call in P.MODEL_GEMMS:
        cfg = P.model_config(target, call)
        if cfg.backend not in families:
            continue
        q, w, sa, sb, bias = _gemm_operands(call.m, call.n, call.k, bias=call.bias)
        y = torch.empty(call.m, call.n, dtype=P.DTYPE)
        up = (torch.empty_like(w), torch.empty(call.n)) if call.pair else None
        if cfg.is_gluon:
            from comfyui_ideogram4_int8.kernels import gemm_gluon as G
            from comfyui_ideogram4_int8.kernels.configs import split_plan

            splits = split_plan(cfg, call.k)[1]
            ws = torch.empty(splits, call.m, call.n, dtype=torch.int32) if splits > 1 else None
            launch = G.build_launch(q, w, sa, sb, bias, y, cfg, False, ws=ws, num_sms=target.num_sms, up=up)
            out.append(launch)
            if ws is not None:
                out.append(T.reduce_launch(ws, sa, sb, bias, y, False))
        else:
            out += T.build_launches(q, w, cfg, sa, sb, bias, y, False, num_sms=target.num_sms, up=up)
    if "triton" in families:
        for m, k in P.MODEL_QUANT_ROWS:
            out.append(Q.build_launch(torch.empty(m, k, dtype=P.DTYPE), num_sms=target.num_sms))
    if "fp8" in families:
        call, codes = P.MODEL_FP8_GEMM, fp8_gemm.FP8_CODES
        out.append(Q.build_launch(torch.empty(call.m, call.k, dtype=P.DTYPE), num_sms=target.num_sms, codes=codes))
        q, w, sa, sb, bias = _gemm_operands(call.m, call.n, call.k, codes, call.bias)
        y = torch.empty(call.m, call.n, dtype=P.DTYPE)
        out += T.build_launches(q, w, P.fp8_case(target).cfg, sa, sb, bias, y, False, num_sms=target.num_sms)
    return [(kernel, args, kwargs) for kernel, _grid, args, kwargs in out]


def check_launches(target, families) -> list:
    """(kernel, args, kwargs) of every launch the families' checks make on ``target``, recorded, nothing run."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon, gemm_triton, quant_triton, self_check, self_check_plan

    made = []

    def record(kernel, grid, args, kwargs):
        made.append((kernel, args, kwargs))

    saved = [
        (module, name, getattr(module, name))
        for module, name in (
            (gemm_triton, "launch"),
            (quant_triton, "launch"),
            (gemm_gluon, "launch"),
            (gemm_gluon, "sm_count"),
            (gemm_triton, "_num_sms"),
            (self_check, "_compare"),
            (self_check_plan, "target_of"),
        )
    ]
    try:
        gemm_triton.launch = quant_triton.launch = gemm_gluon.launch = record
        gemm_gluon.sm_count = gemm_triton._num_sms = lambda device: target.num_sms
        self_check._compare = lambda *args, **kwargs: None
        self_check_plan.target_of = lambda device: target
        for family in families:
            problem = self_check._CHECKS[family](torch.device("cpu"))
            assert problem is None, problem
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    return made


def earlier_launches(target) -> list:
    """The check's problems before it followed the model's calls: the quantizer on 144 x 512 rows, the heuristic
    large tile's raw int32 accumulator on 144 x 208 x 512, the first TMA config on it (2 programs)."""
    from comfyui_ideogram4_int8.kernels import configs as C
    from comfyui_ideogram4_int8.kernels import gemm_triton as T
    from comfyui_ideogram4_int8.kernels import quant_triton as Q

    out = [Q.build_launch(torch.empty(144, 512, dtype=torch.bfloat16))]
    q, w, *_ = _gemm_operands(144, 208, 512)
    acc = torch.empty(144, 208, dtype=torch.int32)
    out += T.build_launches(q, w, C.heuristic_config(target.arch, 4096, 4096, 4096), None, None, None, acc, True)
    tma = [c for c in C.CONFIG_SPACES[target.arch] if c.kernel == "triton-tma"] if target.tma else []
    if tma:
        y = torch.empty(144, 208, dtype=torch.bfloat16)
        out += T.build_launches(q, w, tma[0], torch.empty(144), torch.empty(208), None, y, num_sms=target.num_sms)
    return [(kernel, args, kwargs) for kernel, _grid, args, kwargs in out]


def main(path: str) -> None:
    from comfyui_ideogram4_int8.kernels import fp8_gemm, self_check_plan
    from comfyui_ideogram4_int8.kernels.backends import gluon_import_error
    from comfyui_ideogram4_int8.kernels.env import triton_line

    found = {}
    for name, cc, fields in STAND_INS:
        arch, gpu, line, sms, gluon, tma = fields
        target = self_check_plan.Target(arch, gpu, line or triton_line(), sms, gluon, tma)
        if gluon and gluon_import_error() is not None and "checked on Triton" not in gluon_import_error():
            continue  # the Gluon kernels do not build on this Triton at all
        families = ["triton"] + (["gluon"] if gluon else [])
        if fp8_gemm.fp8_tile_problem(arch, target.line) is None:
            families.append("fp8")

        def keys(launches, cc=cc):
            return sorted({compile_key(kernel, args, kwargs, cc) for kernel, args, kwargs in launches})

        found[name] = {
            "families": families,
            "check": keys(check_launches(target, families)),
            "model": keys(model_launches(target, cc, families)),
            "earlier": keys(earlier_launches(target)),
        }
    with open(path, "w") as f:
        json.dump(found, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
