"""GEMM benchmark at Ideogram 4 shapes: whole-linear time of every peer, in one run, on one GPU.

`python -m comfyui_ideogram4_int8 bench [--shapes qkv,o] [--quick] [--tune] [--out FILE]`

Per shape (M tokens x N out x K in) it times, with triton.testing.do_bench (median, L2 flushed
between repetitions), starting from a bf16 activation and ending with a bf16 output:
  bf16            F.linear with a bf16 weight (cuBLAS)
  dequant-bf16    the 'phantom INT8' path: quantize x, dequantize x and W, bf16 matmul
  cublas-int8     our quantizer + torch._int_mm (cuBLASLt) + our epilogue kernel
  triton-int8     our quantizer + our fused Triton GEMM (the pack's path)
  fp8-rowwise     eager per-row fp8 quantization of x + torch._scaled_mm (FP8 tensor cores)
  ck-int8         comfy-kitchen's int8_linear (ComfyUI's native INT8 path), when importable
plus the parts of ours (quant alone, fused GEMM alone) and the device copy bandwidth.
``--tune`` first times every config of this GPU's space per shape and writes the winners as a
shipped-table fragment (``kernels/tuned_configs.json`` format).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

SHAPES = {  # name: (M, N, K)
    "qkv": (4608, 13824, 4608),
    "o": (4608, 4608, 4608),
    "w1/w3": (4608, 12288, 4608),
    "w2": (4608, 4608, 12288),
    "adaln_modulation": (1, 18432, 512),
    "uncond_qkv": (4096, 13824, 4608),
    "uncond_o": (4096, 4608, 4608),
    "uncond_w1/w3": (4096, 12288, 4608),
    "uncond_w2": (4096, 4608, 12288),
    "llm_cond_proj": (512, 4608, 53248),
}
DEFAULT_SHAPES = ["qkv", "o", "w1/w3", "w2", "uncond_qkv", "uncond_w1/w3", "uncond_w2", "llm_cond_proj"]
TARGETS = {"bf16": 1.6, "ck-int8": 1.4, "fp8-rowwise": 1.2}


def _bench(fn, quick: bool) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 200, return_mode="median")


def _copy_bandwidth(quick: bool) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus written."""
    src = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src), quick)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def _comfy_kitchen():
    try:
        import comfy_kitchen as ck
    except Exception as exc:  # not installed, or its CUDA build does not load
        return None, f"not importable: {exc.__class__.__name__}: {exc}"
    backend = "?"
    try:
        from comfy_kitchen.registry import registry

        backend = "cuda" if registry.is_available("cuda") else "eager/triton"
    except Exception:
        pass
    return ck, f"{getattr(ck, '__version__', '?')} ({backend} backend)"


def _fp8_available() -> bool:
    return hasattr(torch, "float8_e4m3fn") and torch.cuda.get_device_capability() >= (8, 9)


def bench_shape(name, M, N, K, quick, ck, gen):
    from comfyui_ideogram4_int8 import kernels as Kn
    from comfyui_ideogram4_int8.kernels.dispatch import _launch_fused

    dev = "cuda"
    x = (torch.randn(M, K, device=dev, generator=gen) * 0.5).bfloat16()
    x[:, :: max(K // 37, 1)] *= 30  # outlier channels
    w_f = torch.randn(N, K, device=dev, generator=gen) * 0.02
    w_bf = w_f.bfloat16()
    w_q, w_s = Kn.quantize_weight_ref(w_f)
    bias = torch.randn(N, device=dev, generator=gen).bfloat16()
    ref = F.linear(x.float(), w_f, bias.float())

    row = {"shape": name, "M": M, "N": N, "K": K}
    flop = 2.0 * M * N * K

    def record(label, fn):
        out = fn()
        ms = _bench(fn, quick)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        row[f"{label}_ms"] = ms
        row[f"{label}_relerr"] = err
        row[f"{label}_tops"] = flop / (ms * 1e-3) / 1e12

    record("bf16", lambda: F.linear(x, w_bf, bias))
    record("dequant-bf16", lambda: Kn.w8a8_linear(x, w_q, w_s, bias, path="dequant-bf16"))
    record("cublas-int8", lambda: Kn.w8a8_linear(x, w_q, w_s, bias, path="cublas-int8"))
    record("triton-int8", lambda: Kn.w8a8_linear(x, w_q, w_s, bias, path="triton-int8", site=f"bench/{name}"))
    rec = next(r for r in Kn.REGISTRY.layers("bench") if r.layer == name)
    row["triton_config"], row["triton_config_source"] = rec.config, rec.config_source

    if _fp8_available():
        w8 = (w_f / (w_f.abs().amax(1, keepdim=True) / 448.0)).to(torch.float8_e4m3fn)
        w8_s = (w_f.abs().amax(1) / 448.0).float().reshape(1, N)

        def fp8_linear():
            xf = x.float()
            xs = xf.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
            x8 = (xf / xs).to(torch.float8_e4m3fn)
            return torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=w8_s, bias=bias, out_dtype=torch.bfloat16)

        record("fp8-rowwise", fp8_linear)
    if ck is not None:
        w_s_col = w_s.reshape(N, 1).contiguous()
        record("ck-int8", lambda: ck.int8_linear(x, w_q, w_s_col, bias, torch.bfloat16))

    # parts of ours
    q, s = Kn.quantize_per_token(x)
    row["quant_only_ms"] = _bench(lambda: Kn.quantize_per_token(x), quick)
    row["quant_gbps"] = (M * K * 2 + M * K + 4 * M) / (row["quant_only_ms"] * 1e-3) / 1e9
    w_s32 = w_s.float()
    row["triton_gemm_only_ms"] = _bench(
        lambda: _launch_fused(q, w_q, s, w_s32, bias.float(), torch.bfloat16, False), quick
    )
    row["triton_gemm_only_tops"] = flop / (row["triton_gemm_only_ms"] * 1e-3) / 1e12

    # bit-exactness of the accumulator on this very data
    acc = Kn.int8_matmul_int32(q, w_q)
    row["int32_bit_exact_vs_int_mm"] = bool(torch.equal(acc, Kn.dispatch._int_mm_padded(q, w_q)))
    for peer in ("bf16", "ck-int8", "fp8-rowwise", "cublas-int8", "dequant-bf16"):
        if f"{peer}_ms" in row:
            row[f"speedup_vs_{peer}"] = row[f"{peer}_ms"] / row["triton-int8_ms"]
    return row


def tune_shape(M, N, K, quick, gen):
    """Time every config of this GPU's space; return the sorted (ms, config) list."""
    from comfyui_ideogram4_int8 import kernels as Kn
    from comfyui_ideogram4_int8.kernels import configs as C
    from comfyui_ideogram4_int8.kernels.env import arch_name
    from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm

    q = torch.randint(-127, 128, (M, K), device="cuda", dtype=torch.int8, generator=gen)
    w = torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8, generator=gen)
    s = torch.rand(M, device="cuda", generator=gen)
    ws = torch.rand(N, device="cuda", generator=gen)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    props = torch.cuda.get_device_properties(0)
    arch = arch_name(torch.cuda.get_device_capability())
    results = []
    expect = Kn.int8_matmul_int32_ref(q.cpu(), w.cpu()) if M * N * K < 2**34 else None
    for cfg in C.config_space(arch, M, getattr(props, "shared_memory_per_block_optin", None)):
        try:
            ms = _bench(lambda cfg=cfg: launch_gemm(q, w, cfg, s, ws, None, out), quick)
            if expect is not None:
                acc = torch.empty(M, N, device="cuda", dtype=torch.int32)
                launch_gemm(q, w, cfg, out=acc, raw_int32=True)
                if not torch.equal(acc.cpu(), expect):
                    print(f"  {cfg.key()}: WRONG RESULT, skipped", file=sys.stderr)
                    continue
        except Exception as exc:
            print(f"  {cfg.key()}: failed ({exc.__class__.__name__})", file=sys.stderr)
            continue
        results.append((ms, cfg))
    results.sort(key=lambda t: t[0])
    return results


def environment(ck_note: str) -> dict:
    import triton

    cc = torch.cuda.get_device_capability()
    return {
        "gpu": torch.cuda.get_device_name(),
        "cc": f"{cc[0]}.{cc[1]}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "comfy_kitchen": ck_note,
        "date": datetime.date.today().isoformat(),
        "command": "python -m comfyui_ideogram4_int8 " + " ".join(sys.argv[1:]),
    }


def print_table(rows, copy_gbps):
    cols = ["bf16", "dequant-bf16", "cublas-int8", "fp8-rowwise", "ck-int8", "triton-int8"]
    head = f"{'shape':<14}{'M':>6}{'N':>7}{'K':>7} " + "".join(f"{c:>13}" for c in cols)
    head += f"{'x bf16':>8}{'x ck':>7}{'x fp8':>7}{'quant%bw':>9}  config"
    print(head)
    for r in rows:
        line = f"{r['shape']:<14}{r['M']:>6}{r['N']:>7}{r['K']:>7} "
        line += "".join(f"{r[c + '_ms']:>11.3f}ms" if f"{c}_ms" in r else f"{'-':>13}" for c in cols)
        for peer in ("bf16", "ck-int8", "fp8-rowwise"):
            v = r.get(f"speedup_vs_{peer}")
            line += f"{v:>7.2f}x" if v else f"{'-':>8}"
        line += f"{100 * r['quant_gbps'] / copy_gbps:>8.0f}%  {r.get('triton_config')}"
        print(line)


def run_bench(args) -> int:
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU: it compares GEMM peers on the device they run on.", file=sys.stderr)
        return 2
    names = args.shapes.split(",") if args.shapes else DEFAULT_SHAPES
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        print(f"unknown shapes {unknown}; known: {list(SHAPES)}", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    ck, ck_note = _comfy_kitchen()
    info = environment(ck_note)
    result = {"info": info}
    if getattr(args, "tune", False):
        from comfyui_ideogram4_int8.kernels.configs import m_bucket
        from comfyui_ideogram4_int8.kernels.env import arch_name

        table = {}
        for name in names:
            M, N, K = SHAPES[name]
            ranked = tune_shape(M, N, K, args.quick, gen)
            if ranked:
                table[f"{N},{K},{m_bucket(M)}"] = ranked[0][1].as_dict()
                print(f"tune {name}: " + ", ".join(f"{c.key()} {ms:.3f}" for ms, c in ranked[:4]), flush=True)
            result.setdefault("tuning", {})[name] = [(ms, c.key()) for ms, c in ranked]
        arch = arch_name(torch.cuda.get_device_capability())
        result["tuned_table"] = {arch: {info["gpu"]: table}}
        # use the fresh picks for the timed comparison below
        from comfyui_ideogram4_int8.kernels import autotune, configs

        configs.shipped_table.cache_clear()
        merged = configs.shipped_table()
        merged.setdefault(arch, {}).setdefault(info["gpu"], {}).update(table)
        autotune.PICKER.clear()
    copy_gbps = _copy_bandwidth(args.quick)
    info["copy_gbps"] = copy_gbps
    rows = []
    for name in names:
        rows.append(bench_shape(name, *SHAPES[name], args.quick, ck, gen))
        print(f"done {name}", flush=True)
    result["rows"] = rows
    out = pathlib.Path(args.out) if args.out else None
    if out is None:
        slug = info["gpu"].replace(" ", "-")
        out = pathlib.Path("bench/results") / f"gemm-{slug}-{info['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nGPU {info['gpu']} (cc {info['cc']}), torch {info['torch']}, triton {info['triton']}, "
          f"comfy-kitchen {ck_note}, copy {copy_gbps:.0f} GB/s")  # fmt: skip
    print_table(rows, copy_gbps)
    print(f"\nresults: {out}")
    return 0
