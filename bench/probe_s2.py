"""Session-2 probe: where the whole-linear time goes (host vs GPU) and which tiles win.

1. host microseconds per call of each piece (tiny operands: the GPU never limits);
2. GPU-only time (CUDA graph replay of 10 calls) of the quantizer and of whole linears vs bf16/FP8;
3. llm_cond_proj split-K sweep and extra persistent tiles at qkv/o (GEMM only, with bias).
Prints short tables; JSON to $OUT/probe_s2.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F
from comfyui_ideogram4_int8 import kernels as Kn
from comfyui_ideogram4_int8.bench.timing import graph_ms, host_us
from comfyui_ideogram4_int8.kernels import dispatch
from comfyui_ideogram4_int8.kernels.configs import GemmConfig as C
from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm
from comfyui_ideogram4_int8.kernels.quant_triton import quantize_rows_triton

RES: dict = {}


def host_section():
    x = torch.randn(64, 256, device="cuda").bfloat16()
    wq, ws = Kn.quantize_weight_ref(torch.randn(256, 256, device="cuda"))
    q, s = Kn.quantize_per_token(x)
    wbf = torch.randn(256, 256, device="cuda").bfloat16()
    bias = torch.randn(256, device="cuda")
    out = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    cfg_p = C(128, 256, 128, 8, 1, 8, 3, 1, 0, 1)
    cfg_ptr = C(64, 64, 64, 8, 1, 4, 3)
    # a compiled quant kernel, launched through CompiledKernel.run directly (no binder / cache key)
    from comfyui_ideogram4_int8.kernels import quant_triton as QT

    p = QT.quant_launch_params(64, 256)
    qq = torch.empty_like(q)
    ss = torch.empty_like(s)
    args = (x, x, qq, ss, 64, 256, x.stride(0), qq.stride(0), False, p["BLOCK_M"], p["BLOCK_K"], p["ONE_PASS"],
            p["NUM_STAGES"], p["TAIL_K"])
    grid = (QT._programs(64, p["BLOCK_M"], 0, x.device), 1, 1)
    ck = QT._quantize_rows_kernel[grid[:1]](*args, num_warps=p["num_warps"])
    from triton.runtime import driver

    dev = driver.active.get_current_device()

    def direct():
        stream = driver.active.get_current_stream(dev)
        ck.run(grid[0], 1, 1, stream, ck.function, ck.packed_metadata, None, None, None, *args)

    def direct_torch_stream():
        ck.run(grid[0], 1, 1, torch.cuda.current_stream().cuda_stream, ck.function, ck.packed_metadata, None, None,
               None, *args)

    from triton.tools.tensor_descriptor import TensorDescriptor

    calls = {
        "F.linear bf16": lambda: F.linear(x, wbf),
        "torch.empty": lambda: torch.empty((64, 256), dtype=torch.int8, device="cuda"),
        "quant kernel[grid] (jit)": lambda: QT._quantize_rows_kernel[grid[:1]](*args, num_warps=p["num_warps"]),
        "quant CompiledKernel.run": direct,
        "quant run, torch stream": direct_torch_stream,
        "quantize_rows_triton": lambda: quantize_rows_triton(x),
        "quantize_per_token": lambda: Kn.quantize_per_token(x),
        "TensorDescriptor x3": lambda: [TensorDescriptor.from_tensor(t, [64, 64]) for t in (q, wq, out)],
        "launch_gemm pointer": lambda: launch_gemm(q, wq, cfg_ptr, s, ws, bias, out),
        "launch_gemm persistent": lambda: launch_gemm(q, wq, cfg_p, s, ws, bias, out),
        "_launch_fused (picker)": lambda: dispatch._launch_fused(q, wq, s, ws, bias, torch.bfloat16, False),
        "w8a8_linear triton": lambda: Kn.w8a8_linear(x, wq, ws, bias, path="triton-int8", site="diag/x"),
        "w8a8_linear auto": lambda: Kn.w8a8_linear(x, wq, ws, bias, site="diag/y"),
    }
    rows = {}
    print(f"{'host piece':<28}{'us/call':>9}", flush=True)
    for name, fn in calls.items():
        try:
            rows[name] = host_us(fn)
            print(f"{name:<28}{rows[name]:>9.1f}", flush=True)
        except Exception as exc:
            print(f"{name:<28} failed {exc.__class__.__name__}: {exc}", flush=True)
    RES["host_us"] = rows


def make_set(M, N, K, gen, fp8=True):
    x = (torch.randn(M, K, device="cuda", generator=gen) * 0.5).bfloat16()
    x[:, :: max(K // 37, 1)] *= 30
    w_f = torch.randn(N, K, device="cuda", generator=gen) * 0.02
    w_q, w_s = Kn.quantize_weight_ref(w_f)
    st = {"x": x, "w_bf": w_f.bfloat16(), "w_q": w_q, "w_s": w_s.float().contiguous(),
          "bias": torch.randn(N, device="cuda", generator=gen).bfloat16()}
    st["bias32"] = st["bias"].float()
    if fp8:
        amax = w_f.abs().amax(1, keepdim=True)
        st["w8"] = (w_f / (amax / 448.0)).to(torch.float8_e4m3fn)
        st["w8_s"] = (amax / 448.0).float().reshape(1, N)
    st["q"], st["s"] = Kn.quantize_per_token(x)
    st["out"] = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    del w_f
    return st


def fp8_linear(st):
    xf = st["x"].float()
    xs = xf.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
    x8 = (xf / xs).to(torch.float8_e4m3fn)
    return torch._scaled_mm(x8, st["w8"].t(), scale_a=xs, scale_b=st["w8_s"], bias=st["bias"],
                            out_dtype=torch.bfloat16)


def ck_peer():
    try:
        import comfy_kitchen as ck

        return ck
    except Exception as exc:
        print(f"comfy-kitchen not importable: {exc}", flush=True)
        return None


def gpu_section(gen, copy_gbps):
    ck = ck_peer()
    shapes = {"qkv": (4608, 13824, 4608), "o": (4608, 4608, 4608), "w2": (4608, 4608, 12288),
              "llm_cond_proj": (512, 4608, 53248)}
    rows = []
    print(f"\n{'GPU-only (graph)':<16}{'bf16':>9}{'fp8':>9}{'ck':>9}{'ours':>9}{'quant':>9}{'gemm':>9}"
          f"{'x bf16':>8}{'x fp8':>7}{'x ck':>7}{'q%bw':>6}", flush=True)
    for name, (M, N, K) in shapes.items():
        sets = [make_set(M, N, K, gen) for _ in range(2)]
        if ck is not None:
            for st in sets:
                st["w_s_col"] = st["w_s"].reshape(N, 1).contiguous()
        for st in sets:
            st["name"] = name
        r = {"shape": name, "M": M, "N": N, "K": K}
        peers = {
            "bf16": lambda st: F.linear(st["x"], st["w_bf"], st["bias"]),
            "fp8": fp8_linear,
            "ours": lambda st: Kn.w8a8_linear(st["x"], st["w_q"], st["w_s"], st["bias"], path="triton-int8",
                                              site="probe/" + st["name"]),
            "quant": lambda st: quantize_rows_triton(st["x"]),
            "gemm": lambda st: dispatch._launch_fused(st["q"], st["w_q"], st["s"], st["w_s"], st["bias32"],
                                                      torch.bfloat16, False, out=st["out"]),
        }
        if ck is not None:
            peers["ck"] = lambda st: ck.int8_linear(st["x"], st["w_q"], st["w_s_col"], st["bias"], torch.bfloat16)
        for label, f in peers.items():
            try:
                r[label] = graph_ms([lambda st=st, f=f: f(st) for st in sets])
            except Exception as exc:
                print(f"  {name}/{label} failed: {exc.__class__.__name__}: {exc}", flush=True)
        qb = (M * K * 3 + 4 * M) / (r["quant"] * 1e-3) / 1e9
        r["quant_pct_copy"] = 100 * qb / copy_gbps
        rows.append(r)

        def fmt(k, r=r):
            return f"{r[k]:>9.3f}" if k in r else f"{'-':>9}"

        def ratio(k, r=r):
            return f"{r[k] / r['ours']:>7.2f}x" if k in r and "ours" in r else f"{'-':>8}"

        print(f"{name:<16}" + "".join(fmt(k) for k in ("bf16", "fp8", "ck", "ours", "quant", "gemm"))
              + ratio("bf16") + ratio("fp8") + ratio("ck") + f"{r['quant_pct_copy']:>5.0f}%", flush=True)
        del sets
        torch.cuda.empty_cache()
    RES["graph_rows"] = rows


def sweep(name, M, N, K, cfgs, gen, bias=True):
    st = make_set(M, N, K, gen, fp8=False)
    st2 = make_set(M, N, K, gen, fp8=False)
    out = []
    for cfg in cfgs:
        try:
            fns = [lambda s=s, cfg=cfg: launch_gemm(s["q"], s["w_q"], cfg, s["s"], s["w_s"],
                                                    s["bias32"] if bias else None, s["out"]) for s in (st, st2)]
            fns[0]()
            ok = torch.equal(
                launch_gemm(st["q"], st["w_q"], cfg, None, None, None,
                            torch.empty(M, N, dtype=torch.int32, device="cuda"), raw_int32=True),
                dispatch._int_mm_padded(st["q"], st["w_q"]))
            ms = graph_ms(fns)
            out.append((ms, cfg.key(), ok))
        except Exception as exc:
            print(f"  {name} {cfg.key()} failed {exc.__class__.__name__}: {str(exc)[:120]}", flush=True)
    out.sort()
    flop = 2.0 * M * N * K
    print(f"\nsweep {name} ({M}x{N}x{K}, bias={bias}):", flush=True)
    for ms, key, ok in out[:8]:
        print(f"  {key:<34}{ms:>8.3f} ms {flop / ms / 1e9:>7.0f} TOPS exact={ok}", flush=True)
    RES.setdefault("sweeps", {})[f"{name}{'' if bias else '_nobias'}"] = out
    del st, st2
    torch.cuda.empty_cache()


def quant_section(copy_gbps):
    from comfyui_ideogram4_int8.kernels import quant_triton as QT

    rows = []
    for M, K in ((4608, 4608), (4096, 4608), (4608, 12288), (512, 53248)):
        x = torch.randn(M, K, device="cuda").bfloat16()
        x2 = torch.randn(M, K, device="cuda").bfloat16()
        nbytes = M * K * 3 + 4 * M
        p2 = 1 << (K - 1).bit_length()
        variants = [{}]
        for bm in (1, 2, 4):
            for nw in (4, 8, 16):
                for bk in (512, 1024, 2048, 4096, 8192):
                    if bk < K and bm * bk <= 16384:
                        variants.append(dict(BLOCK_M=bm, BLOCK_K=bk, ONE_PASS=False, num_warps=nw))
                if bm * p2 <= 16384:
                    variants.append(dict(BLOCK_M=bm, BLOCK_K=p2, ONE_PASS=True, num_warps=nw))
                head = 1 << (K.bit_length() - 1)  # one pass as a pow2 tile plus a pow2 tail tile
                tail = 1 << max(0, (K - head - 1).bit_length()) if K > head else 0
                if bm * (head + tail) <= 16384:
                    variants.append(dict(BLOCK_M=bm, BLOCK_K=head, ONE_PASS=True, TAIL_K=tail, num_warps=nw))
        res = []
        for v in variants:
            try:
                ms = graph_ms([lambda v=v, a=a: QT.quantize_rows_triton(a, None, v or None) for a in (x, x2)])
                res.append((ms, v))
            except Exception as exc:
                print(f"  quant {v} failed {exc.__class__.__name__}", flush=True)
        res.sort(key=lambda t: t[0])
        default = next(ms for ms, v in res if not v)
        pct = 100 * nbytes / default / 1e6 / copy_gbps
        print(f"quant {M}x{K}: default {nbytes / default / 1e6:.0f} GB/s ({pct:.0f}%)"
              f"; best {nbytes / res[0][0] / 1e6:.0f} GB/s {res[0][1]}; next {[(round(m, 4), v) for m, v in res[1:4]]}",
              flush=True)
        rows.append({"M": M, "K": K, "default_ms": default, "ranked": res[:10]})
    RES["quant"] = rows


def main():
    quick = "--quick" in sys.argv
    gen = torch.Generator(device="cuda").manual_seed(0)
    RES["info"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": __import__("triton").__version__}
    print(RES["info"], flush=True)
    src = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    torch.randn(8192, 8192, device="cuda") @ torch.randn(8192, 8192, device="cuda")  # clocks up
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / (graph_ms([lambda d=dst, s=src: d.copy_(s)], calls=4) * 1e-3) / 1e9
    del src, dst
    RES["copy_gbps"] = copy_gbps
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)
    parts = [a for a in sys.argv[1:] if not a.startswith("--quick")] or ["host", "gpu", "llm", "tiles"]
    if "host" in parts:
        host_section()
    if "gpu" in parts:
        gpu_section(gen, copy_gbps)
    if "quant" in parts:
        quant_section(copy_gbps)
    if "llm" in parts:
        llm = [C(128, 128, 128, 8, sk, w, s) for (w, s) in ((4, 3), (4, 4), (8, 3)) for sk in (1, 2, 3, 4, 6, 8, 11)]
        llm += [C(64, 128, 128, 8, sk, 4, 4) for sk in (1, 2, 4)] + [C(128, 256, 128, 8, sk, 8, 3) for sk in (2, 4, 8)]
        sweep("llm_cond_proj", 512, 4608, 53248, llm if not quick else llm[:7], gen)
    if "tiles" in parts:
        base = C(128, 256, 128, 8, 1, 8, 3, 1, 0, 1)
        pers = [base, C(256, 128, 128, 8, 1, 8, 3, 1, 0, 1), C(128, 256, 128, 16, 1, 8, 3, 1, 0, 1)]
        for name, shp in (("qkv", (4608, 13824, 4608)), ("o", (4608, 4608, 4608))):
            sweep(name, *shp, pers, gen)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "probe_s2.json"), "w") as f:
            json.dump(RES, f, indent=1)


if __name__ == "__main__":
    main()
