"""Diagnostic: does the long-K text projection GEMM's speed depend on the data or on how it is timed?

Times launch_gemm at 512 x 4608 x 53248 with uniform random int8 operands and with operands
quantized from Gaussian data with outlier channels, each with do_bench (L2 flushed) and with
12 back-to-back calls. Prints a 2 x 2 table (ms)."""

from __future__ import annotations

import torch
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.kernels.configs import GemmConfig
from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm
from triton.testing import do_bench


def back_to_back(fn, calls=12):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / calls


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    M, N, K = 512, 4608, 53248
    cfgs = [GemmConfig(128, 128, 128, 8, 1, 8, 3), GemmConfig(128, 128, 128, 8, 4, 4, 3)]
    uni = (torch.randint(-127, 128, (M, K), device="cuda", dtype=torch.int8, generator=g),
           torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8, generator=g))
    x = (torch.randn(M, K, device="cuda", generator=g) * 0.5).bfloat16()
    x[:, ::1439] *= 30
    q, s = Kn.quantize_per_token(x)
    wq, ws = Kn.quantize_weight_ref(torch.randn(N, K, device="cuda", generator=g) * 0.02)
    real = (q, wq)
    sa = torch.rand(M, device="cuda")
    sb = torch.rand(N, device="cuda")
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    from comfyui_ideogram4_int8.kernels.dispatch import _launch_fused

    picked = lambda: _launch_fused(q, wq, s, ws.float(), sb, torch.bfloat16, False)  # noqa: E731
    print(f"_launch_fused (picker, bias): do_bench {do_bench(picked, warmup=25, rep=200, return_mode='median'):.3f} "
          f"b2b {back_to_back(picked):.3f}")
    print(f"{'config':<32}{'data':<10}{'do_bench':>10}{'b2b':>10}  zeros(q)")
    for cfg in cfgs:
        for label, (a, w), bias in (("uniform", uni, None), ("realistic", real, None), ("real+bias", real, sb)):
            fn = lambda a=a, w=w, cfg=cfg, bias=bias: launch_gemm(a, w, cfg, sa, sb, bias, out)  # noqa: E731
            t1 = do_bench(fn, warmup=25, rep=200, return_mode="median")
            t2 = back_to_back(fn)
            print(f"{cfg.key():<32}{label:<10}{t1:>10.3f}{t2:>10.3f}  {(a == 0).float().mean().item():.2f}")


def host_overhead():
    """Host microseconds per call of each entry point on tiny operands (the GPU is never the limit)."""
    import time

    from comfyui_ideogram4_int8.kernels.dispatch import _launch_fused

    x = torch.randn(64, 256, device="cuda").bfloat16()
    wq, ws = Kn.quantize_weight_ref(torch.randn(256, 256, device="cuda"))
    q, s = Kn.quantize_per_token(x)
    cfg = GemmConfig(64, 64, 64, 8, 1, 4, 3)
    wbf = torch.randn(256, 256, device="cuda").bfloat16()
    out = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    calls = {
        "quantize_per_token": lambda: Kn.quantize_per_token(x),
        "launch_gemm (direct)": lambda: launch_gemm(q, wq, cfg, s, ws, None, out),
        "_launch_fused (picker)": lambda: _launch_fused(q, wq, s, ws, None, torch.bfloat16, False),
        "w8a8_linear triton": lambda: Kn.w8a8_linear(x, wq, ws, path="triton-int8", site="diag/x"),
        "F.linear bf16": lambda: torch.nn.functional.linear(x, wbf),
    }
    print(f"{'entry point':<28}{'host us/call':>14}")
    for name, fn in calls.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            fn()
        dt = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
        print(f"{name:<28}{dt:>14.1f}")


if __name__ == "__main__":
    main()
    host_overhead()
