"""Diagnostic: host microseconds per call of the W8A8 entry points on the GPU machine, per GEMM
kernel family (Triton pointer / persistent, Gluon), and a cProfile of the Gluon path.

The operands are small (the GPU never limits), so each number is host time per call."""

from __future__ import annotations

import cProfile
import pstats

import torch
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.bench.timing import host_us
from comfyui_ideogram4_int8.kernels import autotune, gemm_gluon, gemm_triton
from comfyui_ideogram4_int8.kernels.configs import G, GemmConfig


def main():
    m, n, k = 256, 512, 512
    x = torch.randn(m, k, device="cuda").bfloat16()
    wq, ws = Kn.quantize_weight_ref(torch.randn(n, k, device="cuda"))
    ws = ws.float().contiguous()
    bias = torch.randn(n, device="cuda")
    q, s = Kn.quantize_per_token(x)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    wbf = wq.bfloat16()
    cfgs = {
        "pointer": GemmConfig(128, 128, 128, 8, 1, 4, 3),
        "persistent": GemmConfig(128, 256, 128, 8, 1, 8, 3, 1, 0, 1),
        "gluon-ws": G(1, 128, 256, 4),
        "gluon-pingpong": G(2, 128, 128, 5),
    }
    print(f"{'entry':<34}{'host us':>9}")
    print(f"{'F.linear bf16':<34}{host_us(lambda: torch.nn.functional.linear(x, wbf)):>9.1f}")
    print(f"{'quantize_per_token':<34}{host_us(lambda: Kn.quantize_per_token(x)):>9.1f}")
    for name, cfg in cfgs.items():
        t = host_us(lambda cfg=cfg: gemm_triton.launch_gemm(q, wq, cfg, s, ws, bias, out))
        print(f"{'launch_gemm ' + name:<34}{t:>9.1f}")
        autotune.PICKER.pick = lambda *a, cfg=cfg, **kw: (cfg, "diag pin")
        t = host_us(lambda: Kn.w8a8_linear(x, wq, ws, bias, path="triton-int8", site="diag/x"))
        print(f"{'w8a8_linear ' + name:<34}{t:>9.1f}")
    # split-K (llm_cond_proj's kernel family) on a long-K small operand: the host path of the workspace,
    # the reduce kernel, the n = 256 override and the work-list table
    xk = torch.randn(128, 8192, device="cuda").bfloat16()
    wk, wsk = Kn.quantize_weight_ref(torch.randn(n, 8192, device="cuda"))
    wsk = wsk.float().contiguous()
    split = {
        "gluon-ws sk5a": G(1, 128, 256, 4, split_k=5, split_add=1),
        "gluon-ws sk5a_n256": G(1, 128, 256, 4, split_k=5, split_add=1, n256=1),
        "gluon-ws sk5a_n256_lpt2": G(1, 128, 256, 4, split_k=5, split_add=1, n256=1, sched=2),
    }
    for name, cfg in split.items():
        autotune.PICKER.pick = lambda *a, cfg=cfg, **kw: (cfg, "diag pin")
        t = host_us(lambda: Kn.w8a8_linear(xk, wk, wsk, bias, path="triton-int8", site="diag/k"))
        print(f"{'w8a8_linear ' + name:<34}{t:>9.1f}")
    print("gluon direct launches:", [fl.direct_launches for fl in gemm_gluon._LAUNCHERS.values()])
    autotune.PICKER.pick = lambda *a, **kw: (split["gluon-ws sk5a_n256_lpt2"], "diag pin")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        Kn.w8a8_linear(xk, wk, wsk, bias, path="triton-int8", site="diag/k")
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
