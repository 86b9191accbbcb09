"""GPU probe of the Gluon W8A8 GEMM (kernels/gemm_gluon.py) on Hopper.

    PYTHONPATH=<dir holding comfyui_ideogram4_int8> python bench/probe_gluon.py [--quick] [--configs 0,3]

Per Gluon config (kernels.gemm_gluon.PROBE_CONFIGS) and shape it
  1. checks RAW_INT32 bit-exactly against torch._int_mm(q, w.t()),
  2. checks the bf16 output (with bias) against the float64 reference of the same quantized
     operands (relative error, cosine),
  3. times it with triton.testing.do_bench (median, L2 flushed), next to our Triton persistent
     kernel (GemmConfig(128,256,128,8,1,8,3,1,0,1)) and bf16 torch F.linear.
Every config runs in its own child process with a timeout, so a deadlocked kernel (a barrier
phase bug) costs that config only. Prints a table; writes $OUT/probe_gluon.json when OUT is set.

    ... python bench/probe_gluon.py --swiglu [--quick] [--configs 0,4]

instead probes the SwiGLU epilogue (the FFN gate/up GEMM, w13 = [g0 | u0 | g1 | u1 ...] in chunks
of BLOCK_N / 2; out [M, F] = silu(g) * u) on SWIGLU_SHAPES, per config (default: the block_n 256
ones, whose chunk 128 matches the Triton kernel's): out is poisoned with NaN before each run, then
  1. checked against the float64 reference of the same quantized operands (rel_err <= 1e-2,
     cosine >= 0.9999),
  2. compared with our Triton persistent kernel's SwiGLU output (GemmConfig(128,256,128,16,1,8,3,
     1,0,1)): fraction of bit-equal elements and the largest difference,
  3. timed, next to that Triton kernel and the bf16 reference F.silu(x @ w1.T) * (x @ w3.T).
Writes $OUT/probe_gluon_swiglu.json when OUT is set.

    ... python bench/probe_gluon.py --splitk [--quick] [--configs 0,2]

probes the split-K variants (kernels.gemm_gluon.SPLITK_PROBE_CONFIGS, plus the unsplit default ws
config for reference) on SPLITK_SHAPES (llm_cond_proj N 4608, K 53248 at M 512 / 333 / 77, and a
K 4608 case): per config and shape, with the outputs poisoned before every check (int32 sentinel,
NaN),
  1. RAW_INT32 bit-exact against torch._int_mm(q, w.t()) (q padded past 16 rows for cuBLAS), twice
     (the first launch builds the plan, the second runs the cached plan),
  2. bf16 + bias against the float64 reference (rel_err <= 1e-2, cosine >= 0.9999, nothing left NaN),
  3. timed (ws allocation + kernel + reduce), next to the Triton split-K 3 config
     GemmConfig(128,128,128,8,3,4,3) (gemm_triton.launch_gemm) and bf16 F.linear.
Writes $OUT/probe_gluon_splitk.json when OUT is set; exit 2 if any Gluon row fails.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time

SHAPES = [  # name, M, N, K
    ("qkv", 4608, 13824, 4608),
    ("o", 4608, 4608, 4608),
    ("w2", 4608, 4608, 12288),
    ("uncond_qkv", 4096, 13824, 4608),
    ("odd", 333, 1000, 4608),
    ("m17", 17, 4608, 4608),
]
SWIGLU_SHAPES = [  # name, M, F, K: w13 is [2F, K], out [M, F]
    ("ffn13", 4608, 12288, 4608),
    ("uncond_ffn13", 4096, 12288, 4608),
    ("odd_m", 333, 1280, 4608),  # partial M tile (masked scale loads, clipped TMA stores)
]
SWIGLU_TRITON = (128, 256, 128, 16, 1, 8, 3, 1, 0, 1)  # GemmConfig fields
SPLITK_SHAPES = [  # name, M, N, K: llm_cond_proj (M = text tokens, arbitrary) and a short-K case
    ("cond_m512", 512, 4608, 53248),
    ("cond_m333", 333, 4608, 53248),
    ("cond_m77", 77, 4608, 53248),
    ("k4608_m333", 333, 4608, 4608),
]
SPLITK_TRITON = (128, 128, 128, 8, 3, 4, 3)  # GemmConfig fields: the Triton split-K 3 config
SPLITK_SENTINEL = -(2**31) + 7
SWIGLU_REL_ERR = 1e-2
SWIGLU_COS = 0.9999
CHILD_TIMEOUT_S = 150  # a child: every shape's checks and timings of one config
ALIVE_TIMEOUT_S = 60  # a child's first (compiling) launch


def _bench(fn, quick: bool) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=10 if quick else 25, rep=30 if quick else 100, return_mode="median")


def _operands(M, N, K, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda", generator=g)
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda", generator=g)
    sa = torch.rand(M, device="cuda", generator=g) * 0.02 + 1e-3
    sb = torch.rand(N, device="cuda", generator=g) * 0.02 + 1e-3
    bias = torch.randn(N, device="cuda", generator=g)
    return q, w, sa, sb, bias


def _exact_int32(q, w):
    import torch

    try:
        return torch._int_mm(q, w.t())
    except RuntimeError:  # shapes _int_mm refuses (tiny M): float64 is exact below 2**53
        return (q.double() @ w.double().t()).to(torch.int32)


def _error_text(exc: Exception) -> str:
    """First line of an exception, for a table row (the child keeps going with the next shape)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _err(y, ref):
    import torch

    d = (y.double() - ref).norm() / ref.norm().clamp_min(1e-300)
    cos = torch.nn.functional.cosine_similarity(y.double().flatten(), ref.flatten(), dim=0)
    return float(d), float(cos)


def child_gluon(idx: int, quick: bool) -> list[dict]:
    import torch
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    cfg = G.PROBE_CONFIGS[idx]
    # smoke launch (compiles; a deadlocking kernel never gets past this): the parent's watchdog
    # kills the child when @@ALIVE does not show up in time
    q, w, sa, sb, bias = _operands(300, 520, 1024)
    out = torch.empty((300, 520), dtype=torch.bfloat16, device="cuda")
    G.launch_gemm_gluon(q, w, sa, sb, bias, out, cfg=cfg)
    torch.cuda.synchronize()
    print("@@ALIVE", flush=True)
    rows = []
    for name, M, N, K in SHAPES:
        row = {"kernel": cfg.key(), "shape": name, "M": M, "N": N, "K": K}
        try:
            q, w, sa, sb, bias = _operands(M, N, K)
            acc_ref = _exact_int32(q, w)
            raw = torch.full((M, N), -(2**31) + 7, dtype=torch.int32, device="cuda")
            t0 = time.time()
            r = G.launch_gemm_gluon(q, w, None, None, None, raw, raw_int32=True, cfg=cfg)
            torch.cuda.synchronize()
            row["first_launch_s"] = round(time.time() - t0, 2)
            if r is None:
                row["error"] = "launcher refused (TMA alignment)"
                rows.append(row)
                continue
            row["int32_exact"] = bool(torch.equal(raw, acc_ref))
            out = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
            G.launch_gemm_gluon(q, w, sa, sb, bias, out, cfg=cfg)
            torch.cuda.synchronize()
            ref = (acc_ref.double() * sa.double()[:, None]) * sb.double()[None, :] + bias.double()[None, :]
            row["rel_err"], row["cosine"] = _err(out, ref)
            del raw, acc_ref, ref
            ms = _bench(functools.partial(G.launch_gemm_gluon, q, w, sa, sb, bias, out, cfg=cfg), quick)
            row["ms"] = ms
            row["tops"] = 2.0 * M * N * K / (ms * 1e-3) / 1e12
        except Exception as exc:  # one failure must not hide the other shapes
            row["error"] = _error_text(exc)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def child_baselines(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from comfyui_ideogram4_int8.kernels.configs import GemmConfig
    from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm

    tcfg = GemmConfig(128, 256, 128, 8, 1, 8, 3, 1, 0, 1)
    print("@@ALIVE", flush=True)
    rows = []
    for name, M, N, K in SHAPES:
        q, w, sa, sb, bias = _operands(M, N, K)
        out = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
        row = {"kernel": "triton_" + tcfg.key(), "shape": name, "M": M, "N": N, "K": K}
        try:
            launch_gemm(q, w, tcfg, sa, sb, bias, out)
            torch.cuda.synchronize()
            ref = (_exact_int32(q, w).double() * sa.double()[:, None]) * sb.double()[None, :] + bias.double()[None, :]
            row["rel_err"], row["cosine"] = _err(out, ref)
            del ref
            ms = _bench(functools.partial(launch_gemm, q, w, tcfg, sa, sb, bias, out), quick)
            row.update(ms=ms, tops=2.0 * M * N * K / (ms * 1e-3) / 1e12)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        wb = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        bb = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        ms = _bench(functools.partial(F.linear, x, wb, bb), quick)
        rows.append(
            {"kernel": "torch_bf16_linear", "shape": name, "M": M, "N": N, "K": K, "ms": ms,
             "tops": 2.0 * M * N * K / (ms * 1e-3) / 1e12}
        )  # fmt: skip
        q = w = x = wb = out = None  # free before the next shape's operands
        torch.cuda.empty_cache()
    return rows


def _exact_int32_padded(q, w):
    """torch._int_mm(q, w.t()), short q zero-padded for cuBLAS (the pack's own helper)."""
    from comfyui_ideogram4_int8.kernels.dispatch import _int_mm_padded

    return _int_mm_padded(q, w).contiguous()


def _splitk_cfg(idx: int):
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    return G.DEFAULT_CONFIG if idx < 0 else G.SPLITK_PROBE_CONFIGS[idx]


def child_splitk_gluon(idx: int, quick: bool) -> list[dict]:
    import torch
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    cfg = _splitk_cfg(idx)
    q, w, sa, sb, bias = _operands(300, 520, 4096)  # smoke launch (compiles; split where cfg splits)
    out = torch.empty((300, 520), dtype=torch.bfloat16, device="cuda")
    G.launch_gemm_gluon(q, w, sa, sb, bias, out, cfg=cfg)
    torch.cuda.synchronize()
    print("@@ALIVE", flush=True)
    rows = []
    for name, M, N, K in SPLITK_SHAPES:
        row = {"kernel": cfg.key(), "shape": name, "M": M, "N": N, "K": K, "workspace": G.workspace_shape(cfg, M, N, K)}
        try:
            q, w, sa, sb, bias = _operands(M, N, K)
            acc_ref = _exact_int32_padded(q, w)
            raw = torch.full((M, N), SPLITK_SENTINEL, dtype=torch.int32, device="cuda")
            t0 = time.time()
            r = G.launch_gemm_gluon(q, w, None, None, None, raw, raw_int32=True, cfg=cfg)
            torch.cuda.synchronize()
            row["first_launch_s"] = round(time.time() - t0, 2)
            if r is None:
                row["error"] = "launcher refused (TMA alignment)"
                rows.append(row)
                continue
            row["int32_exact"] = bool(torch.equal(raw, acc_ref))
            raw.fill_(SPLITK_SENTINEL)  # the cached plan must write everything too
            G.launch_gemm_gluon(q, w, None, None, None, raw, raw_int32=True, cfg=cfg)
            torch.cuda.synchronize()
            row["int32_exact_cached"] = bool(torch.equal(raw, acc_ref))
            if not row["int32_exact_cached"]:
                row["int32_mismatches"] = int((raw != acc_ref).sum())
                row["sentinel_left"] = int((raw == SPLITK_SENTINEL).sum())
            del raw
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            G.launch_gemm_gluon(q, w, sa, sb, bias, out, cfg=cfg)
            torch.cuda.synchronize()
            ref = (acc_ref.double() * sa.double()[:, None]) * sb.double()[None, :] + bias.double()[None, :]
            row["unwritten"] = int(torch.isnan(out).sum())
            row["rel_err"], row["cosine"] = _err(out, ref)
            del acc_ref, ref
            out.fill_(float("nan"))
            ms = _bench(functools.partial(G.launch_gemm_gluon, q, w, sa, sb, bias, out, cfg=cfg), quick)
            row["unwritten_after_bench"] = int(torch.isnan(out).sum())
            row.update(ms=ms, tops=2.0 * M * N * K / (ms * 1e-3) / 1e12)
            row["ok"] = bool(
                row["int32_exact"] and row["int32_exact_cached"] and row["unwritten"] == 0
                and row["unwritten_after_bench"] == 0 and row["rel_err"] <= SWIGLU_REL_ERR
                and row["cosine"] >= SWIGLU_COS
            )  # fmt: skip
        except Exception as exc:
            row["error"] = _error_text(exc)
        rows.append(row)
        q = w = out = None
        torch.cuda.empty_cache()
    return rows


def child_splitk_baselines(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from comfyui_ideogram4_int8.kernels.configs import GemmConfig
    from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm

    tcfg = GemmConfig(*SPLITK_TRITON)
    print("@@ALIVE", flush=True)
    rows = []
    for name, M, N, K in SPLITK_SHAPES:
        row = {"kernel": "triton_" + tcfg.key(), "shape": name, "M": M, "N": N, "K": K}
        try:
            q, w, sa, sb, bias = _operands(M, N, K)
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch_gemm(q, w, tcfg, sa, sb, bias, out)
            torch.cuda.synchronize()
            ref = (_exact_int32_padded(q, w).double() * sa.double()[:, None]) * sb.double()[None, :]
            ref += bias.double()[None, :]
            row["unwritten"] = int(torch.isnan(out).sum())
            row["rel_err"], row["cosine"] = _err(out, ref)
            del ref
            ms = _bench(functools.partial(launch_gemm, q, w, tcfg, sa, sb, bias, out), quick)
            row.update(ms=ms, tops=2.0 * M * N * K / (ms * 1e-3) / 1e12)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        q = w = out = None
        torch.cuda.empty_cache()
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        wb = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        bb = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        ms = _bench(functools.partial(F.linear, x, wb, bb), quick)
        rows.append(
            {"kernel": "torch_bf16_linear", "shape": name, "M": M, "N": N, "K": K, "ms": ms,
             "tops": 2.0 * M * N * K / (ms * 1e-3) / 1e12}
        )  # fmt: skip
        x = wb = bb = None
        torch.cuda.empty_cache()
    return rows


def print_splitk_table(rows: list[dict]) -> None:
    names = [s[0] for s in SPLITK_SHAPES]
    head = f"{'shape':<11} {'kernel':<46} {'ms':>8} {'TOPS':>6} {'int32==':>7} {'rel_err':>9} {'cos':>9} {'ok':>5}"
    print(head + "  note")
    for r in sorted(rows, key=lambda r: (names.index(r["shape"]), r.get("ms") or 1e9)):
        ms = f"{r['ms']:.4f}" if r.get("ms") else "-"
        tops = f"{r['tops']:.0f}" if r.get("tops") else "-"
        ex = str(r["int32_exact"] and r["int32_exact_cached"]) if "int32_exact_cached" in r else "-"
        re_ = f"{r['rel_err']:.2e}" if "rel_err" in r else "-"
        cos = f"{r['cosine']:.6f}" if "cosine" in r else "-"
        ok = str(r["ok"]) if "ok" in r else "-"
        note = r.get("error", "")
        for k in ("unwritten", "unwritten_after_bench", "int32_mismatches", "sentinel_left"):
            if r.get(k):
                note += f" {k}={r[k]}"
        print(f"{r['shape']:<11} {r['kernel']:<46} {ms:>8} {tops:>6} {ex:>7} {re_:>9} {cos:>9} {ok:>5}  {note}")
    for shape in names:
        g = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("gluon") and r.get("ms")]
        t = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("triton") and r.get("ms")]
        b = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("torch") and r.get("ms")]
        if g and t:
            best = min(g, key=lambda r: r["ms"])
            vs_bf16 = f", {b[0]['ms'] / best['ms']:.3f}x bf16 F.linear" if b else ""
            print(f"{shape:<11} best gluon {best['kernel']} {best['ms']:.4f} ms = "
                  f"{t[0]['ms'] / best['ms']:.3f}x triton split-K 3{vs_bf16}")  # fmt: skip


def _main_splitk(a, G, flags) -> int:
    import torch

    idxs = [int(i) for i in a.configs.split(",")] if a.configs is not None else range(len(G.SPLITK_PROBE_CONFIGS))
    t_start = time.time()
    rows: list[dict] = []
    notes: dict[str, str] = {}
    jobs = ([] if a.no_baselines else [("skbase", "split-K baselines")])
    jobs += [(f"sk{i}", G.SPLITK_PROBE_CONFIGS[i].key()) for i in idxs] + [("sk-1", G.DEFAULT_CONFIG.key())]
    for child, label in jobs:
        t0 = time.time()
        got, note = _run_child(["--child", child, *flags], CHILD_TIMEOUT_S, ALIVE_TIMEOUT_S)
        rows += got
        if note:
            notes[label] = note
        print(f"[{time.time() - t_start:6.1f}s] {label}: {len(got)} rows in {time.time() - t0:.1f}s {note[:500]}")
        sys.stdout.flush()
    print()
    print_splitk_table(rows)
    gl_rows = [r for r in rows if r["kernel"].startswith("gluon")]
    bad = [r for r in gl_rows if not r.get("ok")]
    killed = [k for k in notes if k != "split-K baselines"]
    fail = bool(bad or killed or not gl_rows)
    verdict = f"{len(bad)} gluon rows FAIL, {len(killed)} children failed" if fail else "all gluon rows pass"
    print(f"split-K checks: {verdict}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = os.path.join(out_dir, "probe_gluon_splitk.json")
        cfgs = {_splitk_cfg(i).key(): _splitk_cfg(i).__dict__ for i in [*idxs, -1]}
        with open(path, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
                 "torch": torch.__version__, "configs": cfgs, "rows": rows, "notes": notes,
                 "wall_s": time.time() - t_start}, f, indent=1,
            )  # fmt: skip
        print(f"wrote {path}")
    return 2 if fail else 0


def _swiglu_operands(M, F, K, seed=0):
    """q [M, K], w13 [2F, K] int8; scales of the size that puts the gate in silu's curved range."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda", generator=g)
    w13 = torch.randint(-127, 128, (2 * F, K), dtype=torch.int8, device="cuda", generator=g)
    sa = torch.rand(M, device="cuda", generator=g) * 2e-3 + 1e-3
    s13 = torch.rand(2 * F, device="cuda", generator=g) * 2e-3 + 1e-3
    return q, w13, sa, s13


def _swiglu_ref(q, w13, sa, s13, chunk):
    """float64 h [M, F] of the same quantized operands: exact int32 acc, then dequant + SwiGLU."""
    import torch

    M, n2 = q.shape[0], w13.shape[0]
    y = (_exact_int32(q, w13).double() * sa.double()[:, None]) * s13.double()[None, :]
    y = y.view(M, n2 // (2 * chunk), 2, chunk)
    g, u = y[:, :, 0], y[:, :, 1]
    return (g * torch.sigmoid(g) * u).reshape(M, n2 // 2)


def _swiglu_check(row, out, ref):
    import torch

    row["unwritten"] = int(torch.isnan(out).sum())
    row["rel_err"], row["cosine"] = _err(out, ref)
    row["ok"] = bool(row["unwritten"] == 0 and row["rel_err"] <= SWIGLU_REL_ERR and row["cosine"] >= SWIGLU_COS)


def child_swiglu_gluon(idx: int, quick: bool) -> list[dict]:
    import torch
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G
    from comfyui_ideogram4_int8.kernels.configs import GemmConfig
    from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm

    cfg = G.PROBE_CONFIGS[idx]
    chunk = cfg.block_n // 2
    tcfg = GemmConfig(*SWIGLU_TRITON)
    q, w13, sa, s13 = _swiglu_operands(300, cfg.block_n, 1024)  # smoke launch (compiles)
    out = torch.empty((300, w13.shape[0] // 2), dtype=torch.bfloat16, device="cuda")
    G.launch_gemm_gluon(q, w13, sa, s13, None, out, cfg=cfg, swiglu=True)
    torch.cuda.synchronize()
    print("@@ALIVE", flush=True)
    rows = []
    for name, M, F_, K in SWIGLU_SHAPES:
        row = {"kernel": cfg.key() + "_swiglu", "shape": name, "M": M, "F": F_, "K": K}
        try:
            q, w13, sa, s13 = _swiglu_operands(M, F_, K)
            ref = _swiglu_ref(q, w13, sa, s13, chunk)
            out = torch.full((M, F_), float("nan"), dtype=torch.bfloat16, device="cuda")
            t0 = time.time()
            r = G.launch_gemm_gluon(q, w13, sa, s13, None, out, cfg=cfg, swiglu=True)
            torch.cuda.synchronize()
            row["first_launch_s"] = round(time.time() - t0, 2)
            if r is None:
                row["error"] = "launcher refused (TMA alignment)"
                rows.append(row)
                continue
            _swiglu_check(row, out, ref)
            del ref
            if chunk == tcfg.block_n // 2:  # same interleaving: the Triton kernel's h is comparable
                tout = torch.full((M, F_), float("nan"), dtype=torch.bfloat16, device="cuda")
                launch_gemm(q, w13, tcfg, sa, s13, None, tout, swiglu=True)
                torch.cuda.synchronize()
                row["eq_triton"] = float((out == tout).float().mean())
                row["maxdiff_triton"] = float((out.float() - tout.float()).abs().max())
                del tout
            out.fill_(float("nan"))  # the timed runs must rewrite everything too
            ms = _bench(functools.partial(G.launch_gemm_gluon, q, w13, sa, s13, None, out, cfg=cfg, swiglu=True), quick)
            row["unwritten_after_bench"] = int(torch.isnan(out).sum())
            row.update(ms=ms, tops=2.0 * M * 2 * F_ * K / (ms * 1e-3) / 1e12)
        except Exception as exc:
            row["error"] = _error_text(exc)
        rows.append(row)
        q = w13 = out = None
        torch.cuda.empty_cache()
    return rows


def child_swiglu_baselines(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from comfyui_ideogram4_int8.kernels.configs import GemmConfig
    from comfyui_ideogram4_int8.kernels.gemm_triton import launch_gemm

    tcfg = GemmConfig(*SWIGLU_TRITON)
    print("@@ALIVE", flush=True)
    rows = []
    for name, M, F_, K in SWIGLU_SHAPES:
        row = {"kernel": "triton_" + tcfg.key() + "_swiglu", "shape": name, "M": M, "F": F_, "K": K}
        try:
            q, w13, sa, s13 = _swiglu_operands(M, F_, K)
            ref = _swiglu_ref(q, w13, sa, s13, tcfg.block_n // 2)
            out = torch.full((M, F_), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch_gemm(q, w13, tcfg, sa, s13, None, out, swiglu=True)
            torch.cuda.synchronize()
            _swiglu_check(row, out, ref)
            del ref
            ms = _bench(functools.partial(launch_gemm, q, w13, tcfg, sa, s13, None, out, swiglu=True), quick)
            row.update(ms=ms, tops=2.0 * M * 2 * F_ * K / (ms * 1e-3) / 1e12)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        q = w13 = out = None
        torch.cuda.empty_cache()
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w1 = torch.randn(F_, K, device="cuda", dtype=torch.bfloat16)
        w3 = torch.randn(F_, K, device="cuda", dtype=torch.bfloat16)
        ms = _bench(lambda x=x, w1=w1, w3=w3: F.silu(x @ w1.T) * (x @ w3.T), quick)
        rows.append(
            {"kernel": "torch_bf16 silu(x@w1.T)*(x@w3.T)", "shape": name, "M": M, "F": F_, "K": K, "ms": ms,
             "tops": 2.0 * M * 2 * F_ * K / (ms * 1e-3) / 1e12}
        )  # fmt: skip
        x = w1 = w3 = None
        torch.cuda.empty_cache()
    return rows


def print_swiglu_table(rows: list[dict]) -> None:
    names = [s[0] for s in SWIGLU_SHAPES]
    print(
        f"{'shape':<13} {'kernel':<50} {'ms':>8} {'TOPS':>6} {'rel_err':>9} {'cos':>9} {'ok':>5} "
        f"{'==triton':>8} {'maxdiff':>8}  note"
    )
    for r in sorted(rows, key=lambda r: (names.index(r["shape"]), r.get("ms") or 1e9)):
        ms = f"{r['ms']:.4f}" if r.get("ms") else "-"
        tops = f"{r['tops']:.0f}" if r.get("tops") else "-"
        re_ = f"{r['rel_err']:.2e}" if "rel_err" in r else "-"
        cos = f"{r['cosine']:.6f}" if "cosine" in r else "-"
        ok = str(r["ok"]) if "ok" in r else "-"
        eq = f"{r['eq_triton']:.6f}" if "eq_triton" in r else "-"
        md = f"{r['maxdiff_triton']:.2e}" if "maxdiff_triton" in r else "-"
        note = r.get("error", "")
        if r.get("unwritten") or r.get("unwritten_after_bench"):
            note += f" NaN left: {r.get('unwritten')} / after bench {r.get('unwritten_after_bench')}"
        print(f"{r['shape']:<13} {r['kernel']:<50} {ms:>8} {tops:>6} {re_:>9} {cos:>9} {ok:>5} {eq:>8} {md:>8}  {note}")
    for shape in names:
        g = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("gluon") and r.get("ms")]
        t = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("triton") and r.get("ms")]
        b = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("torch") and r.get("ms")]
        if g and t:
            best = min(g, key=lambda r: r["ms"])
            vs_bf16 = f", {b[0]['ms'] / best['ms']:.3f}x bf16 ref" if b else ""
            print(f"{shape:<13} best gluon {best['kernel']} {best['ms']:.4f} ms = "
                  f"{t[0]['ms'] / best['ms']:.3f}x triton{vs_bf16}")  # fmt: skip


def _run_child(args: list[str], timeout: int, alive_timeout: int) -> tuple[list[dict], str]:
    """Run a child; kill it when it is not alive (first launch done) within alive_timeout seconds,
    or not finished within timeout: a hung kernel then costs seconds, not the whole probe."""
    import tempfile

    cmd = [sys.executable, os.path.abspath(__file__), *args]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        t0 = time.time()
        note = ""
        while p.poll() is None:
            time.sleep(0.5)
            out.seek(0)
            alive = "@@ALIVE" in out.read()
            el = time.time() - t0
            if el > timeout or (not alive and el > alive_timeout):
                p.kill()
                p.wait()
                note = f"KILLED after {el:.0f}s ({'running' if alive else 'first launch never finished: deadlock?'})"
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    rows = []
    for line in stdout.splitlines():
        if line.startswith("@@ROWS "):
            rows = json.loads(line[len("@@ROWS ") :])
    if p.returncode != 0 and not note:
        note = f"exit {p.returncode}: {stderr[-3000:]}"
    elif note:
        note += " " + stderr[-1500:]
    return rows, note


def print_table(rows: list[dict]) -> None:
    print(f"{'shape':<11} {'kernel':<44} {'ms':>8} {'TOPS':>7} {'int32==':>7} {'rel_err':>9} {'cos':>9}  note")
    for r in sorted(rows, key=lambda r: ([s[0] for s in SHAPES].index(r["shape"]), r.get("ms") or 1e9)):
        ms = f"{r['ms']:.4f}" if r.get("ms") else "-"
        tops = f"{r['tops']:.0f}" if r.get("tops") else "-"
        ex = str(r["int32_exact"]) if "int32_exact" in r else "-"
        re_ = f"{r['rel_err']:.2e}" if "rel_err" in r else "-"
        cos = f"{r['cosine']:.6f}" if "cosine" in r else "-"
        print(f"{r['shape']:<11} {r['kernel']:<44} {ms:>8} {tops:>7} {ex:>7} {re_:>9} {cos:>9}  {r.get('error', '')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer timing reps")
    ap.add_argument("--configs", default=None, help="comma-separated PROBE_CONFIGS indices (default: all)")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--swiglu", action="store_true", help="probe the SwiGLU epilogue instead (SWIGLU_SHAPES)")
    ap.add_argument("--splitk", action="store_true", help="probe the split-K variants instead (SPLITK_SHAPES)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.child is not None:  # in the child process: print the rows as one JSON line
        if a.child == "swbase":
            rows = child_swiglu_baselines(a.quick)
        elif a.child == "skbase":
            rows = child_splitk_baselines(a.quick)
        elif a.child.startswith("sk"):
            rows = child_splitk_gluon(int(a.child[2:]), a.quick)
        elif a.child.startswith("sw"):
            rows = child_swiglu_gluon(int(a.child[2:]), a.quick)
        else:
            rows = child_baselines(a.quick) if a.child == "base" else child_gluon(int(a.child), a.quick)
        print("@@ROWS " + json.dumps(rows), flush=True)
        return 0

    import torch
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    why = G.gluon_available(torch.device("cuda"))
    print(f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else None}; gluon: {why or 'ok'}")
    if why is not None:
        return 1
    if a.splitk:
        return _main_splitk(a, G, ["--quick"] if a.quick else [])
    if a.configs is not None:
        idxs = [int(i) for i in a.configs.split(",")]
    elif a.swiglu:  # chunk 128, as the Triton kernel (and dispatch) interleave
        idxs = [i for i, c in enumerate(G.PROBE_CONFIGS) if c.block_n == 256 and G.validate_swiglu(c) is None]
    else:
        idxs = range(len(G.PROBE_CONFIGS))
    flags = ["--quick"] if a.quick else []
    if a.swiglu:
        return _main_swiglu(a, G, idxs, flags)
    t_start = time.time()
    rows: list[dict] = []
    notes: dict[str, str] = {}
    jobs = ([] if a.no_baselines else [("base", "baselines")]) + [(str(i), G.PROBE_CONFIGS[i].key()) for i in idxs]
    for child, label in jobs:
        t0 = time.time()
        got, note = _run_child(["--child", child, *flags], CHILD_TIMEOUT_S, ALIVE_TIMEOUT_S)
        rows += got
        if note:
            notes[label] = note
        print(f"[{time.time() - t_start:6.1f}s] {label}: {len(got)} rows in {time.time() - t0:.1f}s {note[:500]}")
        sys.stdout.flush()
    print()
    print_table(rows)
    for shape, *_ in SHAPES:  # best Gluon vs the Triton kernel, per shape
        g = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("gluon") and r.get("ms")]
        t = [r for r in rows if r["shape"] == shape and r["kernel"].startswith("triton") and r.get("ms")]
        if g and t:
            best = min(g, key=lambda r: r["ms"])
            print(
                f"{shape:<11} best gluon {best['kernel']} {best['ms']:.4f} ms = {t[0]['ms'] / best['ms']:.3f}x triton"
            )
    result = {
        "device": torch.cuda.get_device_name(),
        "triton": __import__("triton").__version__,
        "torch": torch.__version__,
        "configs": {c.key(): c.__dict__ for c in G.PROBE_CONFIGS},
        "rows": rows,
        "notes": notes,
        "wall_s": time.time() - t_start,
    }
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = os.path.join(out_dir, "probe_gluon.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {path}")
    return 0


def _main_swiglu(a, G, idxs, flags) -> int:
    import torch

    t_start = time.time()
    rows: list[dict] = []
    notes: dict[str, str] = {}
    jobs = ([] if a.no_baselines else [("swbase", "swiglu baselines")])
    jobs += [(f"sw{i}", G.PROBE_CONFIGS[i].key() + "_swiglu") for i in idxs]
    for child, label in jobs:
        t0 = time.time()
        got, note = _run_child(["--child", child, *flags], CHILD_TIMEOUT_S, ALIVE_TIMEOUT_S)
        rows += got
        if note:
            notes[label] = note
        print(f"[{time.time() - t_start:6.1f}s] {label}: {len(got)} rows in {time.time() - t0:.1f}s {note[:500]}")
        sys.stdout.flush()
    print()
    print_swiglu_table(rows)
    gl_rows = [r for r in rows if r["kernel"].startswith("gluon")]
    bad = [r for r in gl_rows if not r.get("ok") or r.get("unwritten_after_bench")]
    print(f"SwiGLU checks: {f'{len(bad)} gluon rows FAIL' if bad or not gl_rows else 'all gluon rows pass'}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = os.path.join(out_dir, "probe_gluon_swiglu.json")
        with open(path, "w") as f:
            cfgs = {G.PROBE_CONFIGS[i].key(): G.PROBE_CONFIGS[i].__dict__ for i in idxs}
            json.dump(
                {"device": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
                 "torch": torch.__version__, "configs": cfgs, "rows": rows, "notes": notes,
                 "wall_s": time.time() - t_start}, f, indent=1,
            )  # fmt: skip
        print(f"wrote {path}")
    return 0 if gl_rows and not bad else 2


if __name__ == "__main__":
    sys.exit(main())
