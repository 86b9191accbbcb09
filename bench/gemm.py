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
plus the parts of ours (quant alone, fused GEMM alone), torch._int_mm alone (cuBLASLt's int32 GEMM) and the device
copy bandwidth. Every run ends with a report to paste (``report_markdown``): the GPU and its family, the paths and
backend this machine gets and why, the kernels' first-use self-check, and per shape our whole linear against cuBLAS
bf16 and our fused GEMM against torch._int_mm.
``--smooth`` adds the layout users load (a SmoothQuant vector s per linear, weights stored as W·diag(s)):
  triton-int8-smooth   the whole linear with the divide by s in the activation quantizer (no fold)
  triton-int8-folded   the same weights, the activation arriving already divided by s (what the load-time fold
                       of ideogram4.smooth_fold gives: the quantizer runs without the divide)
  quant-smooth-only    the quantizer with the divide
and for the FFN pair (w1, w3 with different vectors s1, s3): ``triton-int8-unfused-smooth`` (two dividing
passes), ``triton-int8-ratio`` (w1 folded, w3 divides by s3 / s1, two GEMMs) and ``triton-int8-folded`` (one
shared vector min(s1, s3) folded, weights re-quantized to it, one fused SwiGLU GEMM).
``--tune`` first times every config of this GPU's space per shape and writes the winners as a
list of tuning-table entries (``kernels/tuning_table.json`` format) and times the comparison with them.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

from .report import markdown_table, shown_args
from .timing import graph_ms, sustained_ms

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
    "ffn_swiglu": (4608, 12288, 4608),  # silu(x W1^T) * (x W3^T): N is the width of each of W1, W3
    "uncond_ffn_swiglu": (4096, 12288, 4608),
}
SWIGLU_SHAPES = ("ffn_swiglu", "uncond_ffn_swiglu")
DEFAULT_SHAPES = [
    "qkv",
    "o",
    "w1/w3",
    "w2",
    "uncond_qkv",
    "uncond_w1/w3",
    "uncond_w2",
    "llm_cond_proj",
    "ffn_swiglu",
    "uncond_ffn_swiglu",
]
TARGETS = {"bf16": 1.6, "ck-int8": 1.4, "fp8-rowwise": 1.2}


def _bench(fn, quick: bool) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 200, return_mode="median")


def _interleaved(fns: dict, quick: bool, calls: int = 12) -> dict[str, float]:
    """Median ms per call of each peer, measured in interleaved rounds.

    Each sample is ``calls`` back-to-back calls between two CUDA events (host overhead hides
    behind the GPU as it does inside a model; every operand set is larger than L2, and the
    calls rotate over two sets). Rounds alternate the peers so clock drift hits all alike.
    """
    rounds = 3 if quick else 7
    for variants in fns.values():
        for f in variants:
            f()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for label, variants in fns.items():
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(calls):
                variants[i % len(variants)]()
            stop.record()
            stop.synchronize()
            samples[label].append(start.elapsed_time(stop) / calls)
    return {k: sorted(v)[len(v) // 2] for k, v in samples.items()}


SUSTAINED_PEERS = ("triton-int8", "bf16", "ck-int8", "fp8-rowwise")


def _time_peers(row: dict, peers: dict, sets: list, flop: float, quick: bool, speedup_peers, sustained=0.0) -> None:
    """Fill ``row`` with each peer's eager (back-to-back) and GPU-only (graph) time and our speedups;
    with ``sustained`` seconds, also the target peers' time under sustained load (power-capped
    clocks, timing.sustained_ms)."""
    variants = {k: [lambda f=f, st=st: f(st) for st in sets] for k, f in peers.items()}
    for label, ms in _interleaved(variants, quick).items():
        row[f"{label}_ms"] = ms
        row[f"{label}_tops"] = flop / (ms * 1e-3) / 1e12
    for label, fns in variants.items():
        # GPU time = the better of graph replay and eager: graph replay hides our host launch cost,
        # but cuBLAS picks slower bf16 kernels under capture (0.835 vs 0.746 ms at qkv, H100), so a
        # peer is never held to its slower measurement.
        try:
            row[f"{label}_graph_ms"] = graph_ms(fns, reps=7 if quick else 15)
            row[f"{label}_gpu_ms"] = min(row[f"{label}_graph_ms"], row[f"{label}_ms"])
        except Exception as exc:  # e.g. a peer that synchronizes inside: its eager time stands
            row[f"{label}_graph_error"] = f"{exc.__class__.__name__}: {str(exc)[:160]}"
            row[f"{label}_gpu_ms"] = row[f"{label}_ms"]
            torch.cuda.synchronize()
    for peer in speedup_peers:
        if f"{peer}_ms" in row:
            row[f"speedup_vs_{peer}"] = row[f"{peer}_ms"] / row["triton-int8_ms"]
        if f"{peer}_gpu_ms" in row and "triton-int8_gpu_ms" in row:
            row[f"gpu_speedup_vs_{peer}"] = row[f"{peer}_gpu_ms"] / row["triton-int8_gpu_ms"]
    if sustained:
        chosen = {k: v for k, v in variants.items() if k in SUSTAINED_PEERS}
        for label, res in sustained_ms(chosen, seconds=sustained, rounds=2 if quick else 3).items():
            if isinstance(res, str):
                row[f"{label}_sustained_error"] = res
                continue
            row[f"{label}_sustained_ms"], row[f"{label}_sustained_mhz"] = res
        for peer in SUSTAINED_PEERS[1:]:
            if f"{peer}_sustained_ms" in row and "triton-int8_sustained_ms" in row:
                row[f"sustained_speedup_vs_{peer}"] = row[f"{peer}_sustained_ms"] / row["triton-int8_sustained_ms"]


def _sm_clock_mhz() -> int | None:
    try:
        return int(torch.cuda.clock_rate())
    except Exception:
        return None


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


def _smoothquant(w_f, x):
    """SmoothQuant vector (alpha 0.5) of a float weight for the activation x, as transformerlab makes them."""
    from comfyui_ideogram4_int8.ideogram4.synthetic import smoothquant_vector

    return smoothquant_vector(w_f, x.float().abs().amax(0)).contiguous()


def _smooth_ratios(row: dict) -> None:
    """Speedups of the smoothed whole linear, unfolded and folded, against bf16, and the fold's gain."""
    for label in ("triton-int8-smooth", "triton-int8-folded", "triton-int8-unfused-smooth", "triton-int8-ratio"):
        for suffix in ("_gpu_ms", "_ms"):
            if f"{label}{suffix}" in row and f"bf16{suffix}" in row:
                kind = "gpu_" if suffix == "_gpu_ms" else ""
                row[f"{label}_{kind}speedup_vs_bf16"] = row[f"bf16{suffix}"] / row[f"{label}{suffix}"]
    for unfolded in ("triton-int8-smooth", "triton-int8-unfused-smooth"):
        if f"{unfolded}_gpu_ms" in row and "triton-int8-folded_gpu_ms" in row:
            row["fold_gain_gpu"] = row[f"{unfolded}_gpu_ms"] / row["triton-int8-folded_gpu_ms"]


def bench_shape(name, M, N, K, quick, ck, gen, sustained=0.0, smooth=False):
    from comfyui_ideogram4_int8 import kernels as Kn
    from comfyui_ideogram4_int8.kernels.dispatch import _launch_fused

    dev = "cuda"
    row = {"shape": name, "M": M, "N": N, "K": K, "sm_clock_mhz_before": _sm_clock_mhz()}
    flop = 2.0 * M * N * K
    sets = []
    for _ in range(2):  # two operand sets, each larger than L2, to rotate over
        x = (torch.randn(M, K, device=dev, generator=gen) * 0.5).bfloat16()
        x[:, :: max(K // 37, 1)] *= 30  # outlier channels
        w_f = torch.randn(N, K, device=dev, generator=gen) * 0.02
        w_q, w_s = Kn.quantize_weight_ref(w_f)
        st = {"x": x, "w_f": w_f, "w_bf": w_f.bfloat16(), "w_q": w_q, "w_s": w_s}
        st["bias"] = torch.randn(N, device=dev, generator=gen).bfloat16()
        if _fp8_available():
            amax = w_f.abs().amax(1, keepdim=True)
            st["w8"] = (w_f / (amax / 448.0)).to(torch.float8_e4m3fn)
            st["w8_s"] = (amax / 448.0).float().reshape(1, N)
        st["q"], st["s"] = Kn.quantize_per_token(x)
        if smooth:
            st["sm"] = _smoothquant(w_f, x)
            st["w_qs"], st["w_ss"] = Kn.quantize_weight_ref(w_f, st["sm"])
            st["x_div"] = (x.float() / st["sm"]).to(x.dtype)  # what the folded producer hands over
        sets.append(st)

    def fp8_linear(st):
        xf = st["x"].float()
        xs = xf.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
        x8 = (xf / xs).to(torch.float8_e4m3fn)
        return torch._scaled_mm(
            x8, st["w8"].t(), scale_a=xs, scale_b=st["w8_s"], bias=st["bias"], out_dtype=torch.bfloat16
        )

    peers = {
        "bf16": lambda st: F.linear(st["x"], st["w_bf"], st["bias"]),
        "dequant-bf16": lambda st: Kn.w8a8_linear(st["x"], st["w_q"], st["w_s"], st["bias"], path="dequant-bf16"),
        "cublas-int8": lambda st: Kn.w8a8_linear(st["x"], st["w_q"], st["w_s"], st["bias"], path="cublas-int8"),
        "triton-int8": lambda st: Kn.w8a8_linear(
            st["x"], st["w_q"], st["w_s"], st["bias"], path="triton-int8", site=f"bench/{name}"
        ),
        "quant-only": lambda st: Kn.quantize_per_token(st["x"]),
        "int_mm-only": lambda st: Kn.dispatch._int_mm_padded(st["q"], st["w_q"]),
        "triton-gemm-only": lambda st: _launch_fused(
            st["q"], st["w_q"], st["s"], st["w_s"], st["bias"], torch.bfloat16, False
        ),
    }
    if _fp8_available():
        peers["fp8-rowwise"] = fp8_linear
    if smooth:
        peers["triton-int8-smooth"] = lambda st: Kn.w8a8_linear(
            st["x"], st["w_qs"], st["w_ss"], st["bias"], smooth=st["sm"], path="triton-int8"
        )
        peers["triton-int8-folded"] = lambda st: Kn.w8a8_linear(
            st["x_div"], st["w_qs"], st["w_ss"], st["bias"], path="triton-int8"
        )
        peers["quant-smooth-only"] = lambda st: Kn.quantize_per_token(st["x"], st["sm"])
    if ck is not None:
        for st in sets:
            st["w_s_col"] = st["w_s"].reshape(N, 1).contiguous()
        peers["ck-int8"] = lambda st: ck.int8_linear(st["x"], st["w_q"], st["w_s_col"], st["bias"], torch.bfloat16)

    # accuracy of each whole-linear peer against the float32 linear of the unquantized weight
    st0 = sets[0]
    ref = F.linear(st0["x"].float(), st0["w_f"], st0["bias"].float())
    for label, fn in peers.items():
        if label in ("quant-only", "triton-gemm-only", "quant-smooth-only", "int_mm-only"):
            continue
        out = fn(st0)
        row[f"{label}_relerr"] = ((out.float() - ref).norm() / ref.norm()).item()
    del ref
    for st in sets:
        del st["w_f"]
    _time_peers(
        row, peers, sets, flop, quick, ("bf16", "ck-int8", "fp8-rowwise", "cublas-int8", "dequant-bf16"), sustained
    )
    if smooth:
        _smooth_ratios(row)
    if "int_mm-only_gpu_ms" in row and "triton-gemm-only_gpu_ms" in row:
        row["gemm_gpu_speedup_vs_int_mm"] = row["int_mm-only_gpu_ms"] / row["triton-gemm-only_gpu_ms"]
    rec = next(r for r in Kn.REGISTRY.layers("bench") if r.layer == name)
    row["triton_config"], row["triton_config_source"] = rec.config, rec.config_source
    quant_ms = row.get("quant-only_gpu_ms", row["quant-only_ms"])
    row["quant_gbps"] = (M * K * 2 + M * K + 4 * M) / (quant_ms * 1e-3) / 1e9

    # bit-exactness of the accumulator on this very data
    acc = Kn.int8_matmul_int32(st0["q"], st0["w_q"])
    row["int32_bit_exact_vs_int_mm"] = bool(torch.equal(acc, Kn.dispatch._int_mm_padded(st0["q"], st0["w_q"])))
    row["sm_clock_mhz_after"] = _sm_clock_mhz()
    return row


def bench_swiglu(name, M, F_, K, quick, ck, gen, sustained=0.0, smooth=False):
    """The FFN gate/up pair: silu(x W1^T) * (x W3^T), each peer from a bf16 x to a bf16 h."""
    from comfyui_ideogram4_int8 import kernels as Kn

    dev = "cuda"
    row = {"shape": name, "M": M, "N": 2 * F_, "K": K, "sm_clock_mhz_before": _sm_clock_mhz()}
    flop = 2.0 * M * 2 * F_ * K
    sets = []
    for _ in range(2):
        x = (torch.randn(M, K, device=dev, generator=gen) * 0.5).bfloat16()
        x[:, :: max(K // 37, 1)] *= 30
        st = {"x": x}
        for name_w in ("w1", "w3"):
            w_f = torch.randn(F_, K, device=dev, generator=gen) * 0.02
            st[name_w + "_f"] = w_f
            st[name_w + "_bf"] = w_f.bfloat16()
            st[name_w + "_q"], st[name_w + "_s"] = Kn.quantize_weight_ref(w_f)
            if _fp8_available():
                amax = w_f.abs().amax(1, keepdim=True)
                st[name_w + "_8"] = (w_f / (amax / 448.0)).to(torch.float8_e4m3fn)
                st[name_w + "_8s"] = (amax / 448.0).float().reshape(1, F_)
        if smooth:  # the file's layout: w1 and w3 with their own vectors; the fold's two ways out
            from comfyui_ideogram4_int8.ideogram4.smooth_fold import requantize_columns

            s1, s3 = _smoothquant(st["w1_f"], x), _smoothquant(st["w3_f"], x)
            st["s1"], st["s3"], st["ratio"] = s1, s3, (s3 / s1).contiguous()
            st["w1_qs"], st["w1_ss"] = Kn.quantize_weight_ref(st["w1_f"], s1)
            st["w3_qs"], st["w3_ss"] = Kn.quantize_weight_ref(st["w3_f"], s3)
            st["x_div1"] = (x.float() / s1).to(x.dtype)
            shared = torch.minimum(s1, s3)
            q1, c1 = requantize_columns(st["w1_qs"], st["w1_ss"], shared / s1)
            q3, c3 = requantize_columns(st["w3_qs"], st["w3_ss"], shared / s3)
            st["w1_sh"], st["s1_sh"], st["w3_sh"], st["s3_sh"] = q1, c1, q3, c3
            st["x_div_sh"] = (x.float() / shared).to(x.dtype)
        sets.append(st)

    def fp8_lin(x8, xs, w8, w8s):
        return torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=w8s, out_dtype=torch.bfloat16)

    def fp8_pair(st):
        xf = st["x"].float()
        xs = xf.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
        x8 = (xf / xs).to(torch.float8_e4m3fn)
        return F.silu(fp8_lin(x8, xs, st["w1_8"], st["w1_8s"])) * fp8_lin(x8, xs, st["w3_8"], st["w3_8s"])

    def unfused(st, path):
        a = Kn.w8a8_linear(st["x"], st["w1_q"], st["w1_s"], path=path)
        return F.silu(a) * Kn.w8a8_linear(st["x"], st["w3_q"], st["w3_s"], path=path)

    peers = {
        "bf16": lambda st: F.silu(F.linear(st["x"], st["w1_bf"])) * F.linear(st["x"], st["w3_bf"]),
        "cublas-int8": lambda st: unfused(st, "cublas-int8"),
        "triton-int8-unfused": lambda st: unfused(st, "triton-int8"),
        # one GEMM reading gate and up tiles from the two weights as they are, the SwiGLU in its epilogue
        "triton-int8": lambda st: Kn.swiglu_w8a8_pair(
            st["x"], st["w1_q"], st["w1_s"], st["w3_q"], st["w3_s"], path="triton-int8", site=f"bench/{name}"
        ),
    }
    if _fp8_available():
        peers["fp8-rowwise"] = fp8_pair
    if smooth:

        def unfused_smooth(st):
            a = Kn.w8a8_linear(st["x"], st["w1_qs"], st["w1_ss"], smooth=st["s1"], path="triton-int8")
            return F.silu(a) * Kn.w8a8_linear(st["x"], st["w3_qs"], st["w3_ss"], smooth=st["s3"], path="triton-int8")

        def ratio(st):
            a = Kn.w8a8_linear(st["x_div1"], st["w1_qs"], st["w1_ss"], path="triton-int8")
            return F.silu(a) * Kn.w8a8_linear(
                st["x_div1"], st["w3_qs"], st["w3_ss"], smooth=st["ratio"], path="triton-int8"
            )

        peers["triton-int8-unfused-smooth"] = unfused_smooth
        peers["triton-int8-ratio"] = ratio
        peers["triton-int8-folded"] = lambda st: Kn.swiglu_w8a8_pair(
            st["x_div_sh"],
            st["w1_sh"],
            st["s1_sh"],
            st["w3_sh"],
            st["s3_sh"],
            path="triton-int8",
            site=f"bench/{name}-folded",
        )
    if ck is not None:
        for st in sets:
            st["w1_sc"] = st["w1_s"].reshape(F_, 1).contiguous()
            st["w3_sc"] = st["w3_s"].reshape(F_, 1).contiguous()
        peers["ck-int8"] = lambda st: (
            F.silu(ck.int8_linear(st["x"], st["w1_q"], st["w1_sc"], None, torch.bfloat16))
            * (ck.int8_linear(st["x"], st["w3_q"], st["w3_sc"], None, torch.bfloat16))
        )
    st0 = sets[0]
    g = F.linear(st0["x"].float(), st0["w1_f"])
    ref = F.silu(g) * F.linear(st0["x"].float(), st0["w3_f"])
    del g
    for label, fn in peers.items():
        out = fn(st0)
        row[f"{label}_relerr"] = ((out.float() - ref).norm() / ref.norm()).item()
    del ref
    for st in sets:
        del st["w1_f"], st["w3_f"]
    _time_peers(
        row,
        peers,
        sets,
        flop,
        quick,
        ("bf16", "ck-int8", "fp8-rowwise", "cublas-int8", "triton-int8-unfused"),
        sustained,
    )
    if smooth:
        _smooth_ratios(row)
    rec = next(r for r in Kn.REGISTRY.layers("bench") if r.layer == name)
    row["triton_config"], row["triton_config_source"] = rec.config, rec.config_source
    row["sm_clock_mhz_after"] = _sm_clock_mhz()
    return row


def tune_shape(M, N, K, quick, gen):
    """Time every config of this GPU's space; return the sorted (ms, config) list."""
    from comfyui_ideogram4_int8 import kernels as Kn
    from comfyui_ideogram4_int8.kernels import configs as C
    from comfyui_ideogram4_int8.kernels.backends import runnable_kernels
    from comfyui_ideogram4_int8.kernels.env import arch_name
    from comfyui_ideogram4_int8.kernels.fused import launch_config

    q = torch.randint(-127, 128, (M, K), device="cuda", dtype=torch.int8, generator=gen)
    w = torch.randint(-127, 128, (N, K), device="cuda", dtype=torch.int8, generator=gen)
    s = torch.rand(M, device="cuda", generator=gen)
    ws = torch.rand(N, device="cuda", generator=gen)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    props = torch.cuda.get_device_properties(0)
    arch = arch_name(torch.cuda.get_device_capability())
    results = []
    expect = Kn.int8_matmul_int32_ref(q.cpu(), w.cpu()) if M * N * K < 2**34 else None
    smem = getattr(props, "shared_memory_per_block_optin", None)
    for cfg in C.config_space(arch, M, smem, runnable_kernels(torch.device("cuda"))):
        try:
            ms = _bench(lambda cfg=cfg: launch_config(cfg, q, w, s, ws, None, out, False), quick)
            if expect is not None:
                acc = torch.empty(M, N, device="cuda", dtype=torch.int32)
                launch_config(cfg, q, w, None, None, None, acc, True)
                if not torch.equal(acc.cpu(), expect):
                    print(f"  {cfg.key()}: WRONG RESULT, skipped", file=sys.stderr)
                    continue
        except Exception as exc:
            print(f"  {cfg.key()}: failed ({exc.__class__.__name__})", file=sys.stderr)
            continue
        results.append((ms, cfg))
    results.sort(key=lambda t: t[0])
    return results


def quant_sweep(quick, gen) -> list[dict]:
    """Time the activation quantizer's launch variants at the Ideogram 4 activation shapes."""
    from comfyui_ideogram4_int8.kernels import quant_triton as QT

    rows = []
    for M, K in ((4608, 4608), (4608, 12288), (512, 53248), (4096, 4608)):
        x = (torch.randn(M, K, device="cuda", generator=gen)).bfloat16()
        nbytes = M * K * 3 + 4 * M
        variants = [QT.quant_launch_params(M, K)]
        p2 = triton_next_pow2(K)
        for per_sm in (0, 4, 8, 16):
            for ns in (1, 2, 3) if per_sm else (1,):
                for nw in (4, 8):
                    base = dict(BLOCK_M=1, num_warps=nw, PROGRAMS_PER_SM=per_sm, NUM_STAGES=ns)
                    if p2 <= 16384:
                        variants.append(dict(base, BLOCK_K=p2, ONE_PASS=True))
                    for bk in (1024, 4096, 8192):
                        if bk < K:
                            variants.append(dict(base, BLOCK_K=bk, ONE_PASS=False))
        for v in variants:
            try:
                ms = _bench(lambda v=v, x=x: QT.quantize_rows_triton(x, None, v), quick)
            except Exception as exc:
                print(f"  quant {v}: failed {exc.__class__.__name__}", file=sys.stderr)
                continue
            rows.append({"M": M, "K": K, **v, "ms": ms, "gbps": nbytes / (ms * 1e-3) / 1e9})
        best = min((r for r in rows if r["M"] == M and r["K"] == K), key=lambda r: r["ms"])
        default = next(r for r in rows if r["M"] == M and r["K"] == K)
        print(f"quant {M}x{K}: default {default['gbps']:.0f} GB/s, best {best['gbps']:.0f} GB/s {best}", flush=True)
    return rows


def triton_next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


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
        "command": "python -m comfyui_ideogram4_int8 " + shown_args(sys.argv[1:]),
    }


def print_table(rows, copy_gbps):
    """Two blocks: GPU time (graph replay: what a model that keeps the GPU busy sees) and eager
    back-to-back calls (host launch cost included where it exceeds the GPU time)."""
    cols = ["bf16", "dequant-bf16", "cublas-int8", "fp8-rowwise", "ck-int8", "triton-int8"]
    for title, suffix, speed in (
        ("GPU time: best of CUDA-graph replay and eager", "_gpu_ms", "gpu_speedup_vs_"),
        ("eager, back-to-back calls", "_ms", "speedup_vs_"),
    ):
        print(f"\n{title}")
        head = f"{'shape':<18}{'M':>5}{'N':>7}{'K':>7} " + "".join(f"{c:>13}" for c in cols)
        head += f"{'x bf16':>8}{'x ck':>7}{'x fp8':>7}{'quant%bw':>9}  config"
        print(head)
        for r in rows:
            line = f"{r['shape']:<18}{r['M']:>5}{r['N']:>7}{r['K']:>7} "
            line += "".join(f"{r[c + suffix]:>11.3f}ms" if f"{c}{suffix}" in r else f"{'-':>13}" for c in cols)
            for peer in ("bf16", "ck-int8", "fp8-rowwise"):
                v = r.get(f"{speed}{peer}")
                line += f"{v:>7.2f}x" if v else f"{'-':>8}"
            qbw = f"{100 * r['quant_gbps'] / copy_gbps:.0f}%" if "quant_gbps" in r else "-"
            line += f"{qbw:>9}  {r.get('triton_config')}"
            print(line)
    if any("triton-int8_sustained_ms" in r for r in rows):
        print_sustained(rows)
    print(
        f"targets: x bf16 >= {TARGETS['bf16']}, x ck >= {TARGETS['ck-int8']}, x fp8 >= {TARGETS['fp8-rowwise']};"
        " quant >= 70% of copy bandwidth (GPU time)"
    )


def print_smooth(rows) -> None:
    """The smoothed layout: whole linear with the divide (unfolded) vs the activation divided upstream (folded)."""
    print("\nSmoothQuant layout (GPU time, x bf16): unfolded = divide in the quantizer, folded = divide moved upstream")
    cols = (
        "triton-int8",
        "triton-int8-smooth",
        "triton-int8-unfused-smooth",
        "triton-int8-ratio",
        "triton-int8-folded",
    )
    print(f"{'shape':<18}" + "".join(f"{c:>28}" for c in cols) + f"{'fold gain':>11}{'quant÷':>9}")
    for r in rows:
        line = f"{r['shape']:<18}"
        for c in cols:
            ms = r.get(f"{c}_gpu_ms")
            sp = r.get("gpu_speedup_vs_bf16" if c == "triton-int8" else f"{c}_gpu_speedup_vs_bf16")
            line += f"{ms:>15.3f}ms {sp or 0:>5.2f}x bf16" if ms else f"{'-':>28}"
        gain = r.get("fold_gain_gpu")
        line += f"{gain:>10.2f}x" if gain else f"{'-':>11}"
        qs, q = r.get("quant-smooth-only_gpu_ms"), r.get("quant-only_gpu_ms")
        line += f"{qs / q:>8.2f}x" if qs and q else f"{'-':>9}"
        print(line)


def print_sustained(rows) -> None:
    """The third block: each target peer replayed back to back for a sustained window (the board at
    its power limit, as in a sampling loop), with the median SM clock NVML read during it."""
    print("\nsustained load: graph replays back to back, interleaved rounds (ms per call @ median SM MHz)")
    cols = SUSTAINED_PEERS[1:] + SUSTAINED_PEERS[:1]
    print(f"{'shape':<18}" + "".join(f"{c:>20}" for c in cols) + f"{'x bf16':>8}{'x ck':>7}{'x fp8':>7}")
    for r in rows:
        line = f"{r['shape']:<18}"
        for c in cols:
            ms, mhz = r.get(f"{c}_sustained_ms"), r.get(f"{c}_sustained_mhz")
            line += f"{ms:>9.3f}ms @{mhz or 0:>5.0f}MHz" if ms else f"{'-':>20}"
        for peer in ("bf16", "ck-int8", "fp8-rowwise"):
            v = r.get(f"sustained_speedup_vs_{peer}")
            line += f"{v:>7.2f}x" if v else f"{'-':>8}"
        print(line)


def report_markdown(result: dict) -> str:
    """The run as Markdown to paste into an issue: the GPU and its family, what this machine runs (``pack``: the
    `info` report), the self-check, and per shape our whole linear's GPU time against cuBLAS bf16's and our fused GEMM's
    against torch._int_mm's (ratios above 1: ours is faster), with the tile config and where it came from."""
    info, pack = result["info"], result.get("pack", {})
    check = pack.get("self_check", {})
    done = "; ".join(
        f"{r['family']} {'passed' if r['passed'] else 'FAILED (' + str(r['why']) + ')'}"
        + (" (cached)" if r["from_cache"] else f" in {r['seconds']:.2f} s")
        for r in check.get("results", [])
    )
    lines = [
        f"### Ideogram 4 INT8 bench: {info['gpu']}",
        "",
        f"- GPU: {info['gpu']}, sm_{info['cc'].replace('.', '')} ({pack.get('arch', '?')}: {pack.get('family', '?')})",
        f"- pack {pack.get('version', '?')}, torch {info['torch']} (CUDA {info['cuda']}), Triton {info['triton']}",
        f"- W8A8 linears: {pack.get('gemm_path', '?')} ({pack.get('gemm_path_reason', '?')}); backend "
        f"{pack.get('backend', '?')}: {pack.get('backend_reason', '?')}",
        f"- protected fp8 layers: {pack.get('fp8_protected_path', '?')} ({pack.get('fp8_protected_reason', '?')})",
        f"- self-check: {done or 'none run'} (runs: {check.get('runs', '?')})",
        f"- device copy {info.get('copy_gbps', 0):.0f} GB/s; command: `{info['command']}`",
        "",
    ]

    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    def cells(r):
        exact = {None: "-", True: "yes", False: "NO"}[r.get("int32_bit_exact_vs_int_mm")]
        ours = [num(r.get("triton-int8_gpu_ms"), ".3f"), num(r.get("gpu_speedup_vs_bf16"), ".2f")]
        gemm = [num(r.get("triton-gemm-only_gpu_ms"), ".3f"), num(r.get("gemm_gpu_speedup_vs_int_mm"), ".2f")]
        config = f"{r.get('triton_config')} ({r.get('triton_config_source')})"
        return [r["shape"], r["M"], r["N"], r["K"], *ours, *gemm, exact, config]

    head = ("shape", "M", "N", "K", "ours ms", "x cuBLAS bf16", "GEMM ms", "x torch._int_mm", "int32 exact")
    rows = [cells(r) for r in result.get("rows", [])]
    rows += [[name, f"failed: {why}"] for name, why in result.get("failed", {}).items()]
    lines += markdown_table((*head, "config (source)"), rows, right=range(1, 8))
    lines.append("")
    lines.append(
        "GPU time per call: the better of CUDA-graph replay and eager back-to-back calls. Ours: the whole linear (bf16 "
        "in, quantizer, fused GEMM, bf16 out) against cuBLAS bf16's F.linear; GEMM: our fused GEMM with its dequant + "
        "bias epilogue against torch._int_mm's int32 product alone."
    )
    return "\n".join(lines)


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
        from comfyui_ideogram4_int8.kernels import tuning
        from comfyui_ideogram4_int8.kernels.configs import m_bucket
        from comfyui_ideogram4_int8.kernels.env import arch_name, triton_line

        arch, entries = arch_name(torch.cuda.get_device_capability()), []
        for name in names:
            M, N, K = SHAPES[name]
            if name in SWIGLU_SHAPES or any((e["N"], e["K"], e["m_bucket"]) == (N, K, m_bucket(M)) for e in entries):
                continue  # SwiGLU: tuned on first use, under its own epilogue key
            ranked = tune_shape(M, N, K, True, gen)  # ranking only: short repetitions
            if ranked:
                entries.append(
                    {
                        "arch": arch,
                        "gpu": info["gpu"],
                        "triton": triton_line(),
                        "N": N,
                        "K": K,
                        "m_bucket": m_bucket(M),
                        "epilogue": "linear",
                        "config": ranked[0][1].as_dict(),
                        "measured": f"bench --tune, {info['gpu']}, {info['date']} (commit ...)",
                    }
                )
                print(f"tune {name}: " + ", ".join(f"{c.key()} {ms:.3f}" for ms, c in ranked[:4]), flush=True)
            result.setdefault("tuning", {})[name] = [(ms, c.key()) for ms, c in ranked]
        result["tuning_table_entries"] = entries
        tuning.shipped_table()[:0] = entries  # the fresh picks serve the timed comparison below
        tuning.PICKER.clear()
    copy_gbps = _copy_bandwidth(args.quick)
    info["copy_gbps"] = copy_gbps
    if getattr(args, "quant_sweep", False):
        result["quant_sweep"] = quant_sweep(True, gen)
    out = pathlib.Path(args.out) if args.out else None
    if out is None:
        slug = info["gpu"].replace(" ", "-")
        out = pathlib.Path("bench/results") / f"gemm-{slug}-{info['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = result["rows"] = []
    for name in names:
        try:
            fn = bench_swiglu if name in SWIGLU_SHAPES else bench_shape
            rows.append(
                fn(
                    name,
                    *SHAPES[name],
                    args.quick,
                    ck,
                    gen,
                    getattr(args, "sustained", 0.0),
                    getattr(args, "smooth", False),
                )
            )
        except Exception as exc:  # keep the other shapes' numbers
            print(f"shape {name} failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            result.setdefault("failed", {})[name] = f"{exc.__class__.__name__}: {exc}"
        out.write_text(json.dumps(result, indent=1))
        torch.cuda.empty_cache()
    print(
        f"\nGPU {info['gpu']} (cc {info['cc']}), torch {info['torch']}, triton {info['triton']}, "
        f"comfy-kitchen {ck_note}, copy {copy_gbps:.0f} GB/s"
    )
    print_table(rows, copy_gbps)
    if getattr(args, "smooth", False):
        print_smooth(rows)
    from comfyui_ideogram4_int8.machine_info import info_report

    result["pack"] = info_report()  # after the shapes ran: the self-check results and demotions they caused
    result["report"] = report_markdown(result)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nresults: {out}\n\nreport to paste (also in the JSON):\n\n{result['report']}")
    return 0
