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
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
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
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.child is not None:  # in the child process: print the rows as one JSON line
        rows = child_baselines(a.quick) if a.child == "base" else child_gluon(int(a.child), a.quick)
        print("@@ROWS " + json.dumps(rows), flush=True)
        return 0

    import torch
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    why = G.gluon_available(torch.device("cuda"))
    print(f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else None}; gluon: {why or 'ok'}")
    if why is not None:
        return 1
    idxs = range(len(G.PROBE_CONFIGS)) if a.configs is None else [int(i) for i in a.configs.split(",")]
    flags = ["--quick"] if a.quick else []
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


if __name__ == "__main__":
    sys.exit(main())
