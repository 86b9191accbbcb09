"""Offline (no GPU, no driver) compile of the pack's kernels for NVIDIA targets on the installed Triton.

    python tests/offline_compile.py [--arch 80 86 89 90 100 120] [--quick] [--json FILE]

Each case is built by the product's own host code (``gemm_triton.build_launches``,
``gemm_gluon.build_launch``) from CPU tensors and compiled as ``JITFunction.run`` would, minus the
launch: ``triton.compile(ASTSource, target=GPUTarget("cuda", cc, 32))`` with the wheel's ptxas. Checked
per case: it compiles; an int8 GEMM holds int8 MMA in its PTX (``wgmma ... s8`` where the config
qualifies for wgmma on Hopper; on sm_100 ``tcgen05.mma ... kind::i8`` or ``mma.sync``, as the Triton line lowers
it; ``mma.sync ... s8`` otherwise) and, for TMA kernels, TMA loads; the fp8 GEMM holds e4m3 MMA (``mma.sync ...
e4m3``, ``wgmma ... e4m3`` or ``tcgen05.mma ... kind::f8f6f4``) on every family and Triton line where the pack runs
it (``fp8_gemm.fp8_tile_problem``); shared memory within the family's limit (configs.SMEM_LIMIT: 163 KB sm_80,
99 KB sm_86/89/120, 227 KB sm_90/100); no spills in the cubin.

Cases: every portable config of the arch's search space (kernels/configs.py) and every shipped pick
(kernels/tuning_table.json), the raw-int32 and split-K epilogues and the SwiGLU gate/up pair read from two weights
(``swiglu-pair``), the quantizer and the q/k norm + RoPE kernel; for sm_90a the Gluon configs. ``--quick``
compiles one config per kernel family.
Gluon on a Triton line the pack does not enable (backends.GLUON_TRITON_LINES) is compiled for
information only: its failures are reported as INFO and do not fail the run.
Exit status 1 if a case that must build fails. Used by tests/unit/test_offline_compile.py and the CI
compile matrix (.ci/compile-matrix), one throwaway venv per Triton version.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import torch

ARCHS = (80, 86, 89, 90, 100, 120)
# configs.SMEM_LIMIT per compute capability (a test keeps them equal; this file imports the pack only in functions)
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}


def _bin(tool: str) -> pathlib.Path:
    import triton

    return pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool


def ptxas_present() -> bool:
    try:
        return _bin("ptxas").exists()
    except ImportError:
        return False


# -- compiling without a driver --------------------------------------------------------------------


def compile_offline(kernel, args, kwargs, cc: int):
    """JITFunction.run's binding and packing, then triton.compile for GPUTarget("cuda", cc, 32).

    These are Triton internals (the test tool's, never the product's): 3.5+ packs in ``_pack_args``,
    3.4 inline in ``run``; Gluon kernels compile from a ``GluonASTSource``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", cc, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    if hasattr(kernel, "_pack_args"):
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, opts)
        options = options.__dict__
    else:
        from triton._utils import find_paths_if, get_iterable_path

        options = backend.parse_options(kwargs).__dict__
        sigvals = [x[0] for x in spec]
        signature = {p.name: v for p, v in zip(kernel.params, sigvals, strict=True)}
        paths = find_paths_if(sigvals, lambda _, val: val == "constexpr")
        constexprs = {p: get_iterable_path(list(bound.values()), p) for p in paths}
        attrvals = [x[1] for x in spec]
        paths = find_paths_if(attrvals, lambda _, x: isinstance(x, str))
        attrs = {p: backend.parse_attr(get_iterable_path(attrvals, p)) for p in paths}
    source = ASTSource
    if type(kernel).__name__.startswith("Gluon"):
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(kernel, signature, constexprs, attrs), target=target, options=options)


def ptx_facts(ptx: str) -> dict:
    return {
        "wgmma_s8": len(re.findall(r"wgmma\.mma_async\.\S*s8", ptx)),
        "mma_sync_s8": len(re.findall(r"mma\.sync\.aligned\.\S*s8", ptx)),
        "tcgen05_i8": len(re.findall(r"tcgen05\.mma\.\S*kind::i8", ptx)),
        # e4m3 operands on fp8 tensor cores (not widened to f16 first)
        "mma_e4m3": len(
            re.findall(r"(?:mma\.sync\.aligned|wgmma\.mma_async)\.\S*e4m3|tcgen05\.mma\.\S*kind::f8f6f4", ptx)
        ),
        "wgmma_shapes": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.s32\.s8", ptx))),
        # a TMA load is spelled shared::cluster up to Triton 3.6, shared::cta from 3.7
        "tma_load": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cluster|cta)\.global", ptx)),
        "tma_store": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
    }


def _mma_kind(f: dict) -> str:
    """The row's MMA column: the int8 instruction family in the PTX, else "e4m3" (an fp8 GEMM), else "-"."""
    kinds = (("wgmma", "wgmma_s8"), ("tcgen05", "tcgen05_i8"), ("mma.sync", "mma_sync_s8"), ("e4m3", "mma_e4m3"))
    return next((name for name, fact in kinds if f[fact]), "-")


def cubin_facts(cubin: bytes) -> dict:
    """Registers and local memory (spills) from the wheel's cuobjdump; {} where it is missing."""
    tool = _bin("cuobjdump")
    if not tool.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            res = subprocess.run(
                [tool, "--dump-resource-usage", f.name], capture_output=True, text=True, timeout=120
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
    return {"regs": int(m.group(1)), "stack": int(m.group(2)), "local": int(m.group(3))} if m else {}


# -- the cases ---------------------------------------------------------------------------------------


def _arch(cc: int) -> str:
    from comfyui_ideogram4_int8.kernels.env import arch_name

    return arch_name((cc // 10, cc % 10))


def _gemm_operands(M, N, K, out_dtype=torch.bfloat16):
    q = torch.empty(M, K, dtype=torch.int8)
    w = torch.empty(N, K, dtype=torch.int8)
    return q, w, torch.empty(M), torch.empty(N), torch.empty(M, N, dtype=out_dtype)


def _shape_for(cfg):
    """A shape this config really serves: split-K at llm_cond_proj's, small tiles at few tokens."""
    if cfg.split_k > 1:
        return 512, 4608, 53248
    if cfg.block_m <= 64 and cfg.kernel == "triton":
        return 64, 4608, 4608
    return 4608, 4608, 4608


def _configs(cc: int, quick: bool) -> list:
    """(config, epilogue) pairs for this arch: the search space, the shipped picks, the extra epilogues."""
    from comfyui_ideogram4_int8.kernels import configs as C
    from comfyui_ideogram4_int8.kernels import tuning

    arch = _arch(cc)
    space = list(C.CONFIG_SPACES.get(arch, []))
    picks = [C.GemmConfig.from_dict(e["config"]) for e in tuning.shipped_table() if e["arch"] == arch]
    seen, out = set(), []
    for cfg in space + picks:
        if cfg.kernel == "triton-tma" and cc < 90:
            continue
        if cfg.is_gluon and cc != 90:
            continue
        if cfg in seen or cfg.smem_bytes() > SMEM_LIMIT[cc] - 2048:
            continue
        seen.add(cfg)
        out.append((cfg, "linear"))
    if quick:  # one config per kernel family and split mode
        fam: dict = {}
        for cfg, epi in out:
            fam.setdefault((cfg.kernel, cfg.split_k > 1, cfg.block_m <= 64), (cfg, epi))
        out = list(fam.values())
    # the other epilogues, on the first config of each kernel that can run them
    for kernel in ("triton", "triton-tma", "gluon-ws", "gluon-pingpong"):
        first = next((c for c, _ in out if c.kernel == kernel and c.split_k == 1 and c.block_m >= 64), None)
        if first is None:
            continue
        out.append((first, "raw"))
        if first.problem(2, swiglu=True) is None:
            out.append((first, "swiglu-pair"))
    return out


def gemm_launches(cfg, epilogue: str, cc: int):
    """The launches of one GEMM case, built by the product's host code from CPU tensors."""
    M, N, K = _shape_for(cfg)
    q, w, sa, sb, out = _gemm_operands(M, N, K, torch.int32 if epilogue == "raw" else torch.bfloat16)
    bias = None if epilogue != "linear" else torch.empty(N)
    raw = epilogue == "raw"
    up = None
    if epilogue == "swiglu-pair":  # gate w1 and up w3 [F, K] as two tensors, F = N / 2, out [M, F]
        w, up = w[: N // 2], (torch.empty(N // 2, K, dtype=torch.int8), torch.empty(N // 2))
        sb, out = sb[: N // 2], torch.empty(M, N // 2, dtype=out.dtype)
    if cfg.is_gluon:
        from comfyui_ideogram4_int8.kernels import gemm_gluon as G
        from comfyui_ideogram4_int8.kernels.configs import split_plan

        kps, splits = split_plan(cfg, K)
        ws = torch.empty(splits, M, N, dtype=torch.int32) if splits > 1 else None
        return [
            G.build_launch(
                q, w, None if raw else sa, None if raw else sb, bias, out, cfg, raw, ws=ws, num_sms=132, up=up
            )
        ]
    from comfyui_ideogram4_int8.kernels import gemm_triton as T

    return T.build_launches(q, w, cfg, None if raw else sa, None if raw else sb, bias, out, raw, num_sms=132, up=up)


def other_launches(cc: int = 90) -> list:
    """(name, kernel, grid, args, kwargs) of the quantizer, the q/k norm + RoPE kernel and the block's norms on
    compute capability ``cc`` (the quantizer's e4m3 codes from 89: Ada, Hopper and Blackwell have FP8; the fp8 GEMM
    where the pack runs it on this Triton line)."""
    from comfyui_ideogram4_int8.kernels import qk_norm_rope_triton as R
    from comfyui_ideogram4_int8.kernels import quant_triton as Q

    cases = []
    for m, k, smooth in ((4608, 4608, False), (4608, 12288, True), (512, 53248, True), (1, 512, False)):
        x = torch.empty(m, k, dtype=torch.bfloat16)
        (kernel, grid, args, kwargs) = Q.build_launch(x, x[0] if smooth else None, num_sms=132)
        cases.append((f"quantize {m}x{k}{' smooth' if smooth else ''}", kernel, grid, args, kwargs))
    if cc >= 89:
        for m, k in ((4608, 12288), (1000, 3000)):  # the protected w2's K as a head and a tail tile; two passes
            x = torch.empty(m, k, dtype=torch.bfloat16)
            (kernel, grid, args, kwargs) = Q.build_launch(x, num_sms=132, codes=torch.float8_e4m3fn)
            cases.append((f"quantize {m}x{k} to e4m3", kernel, grid, args, kwargs))
    from comfyui_ideogram4_int8.kernels import fp8_gemm
    from comfyui_ideogram4_int8.kernels.env import triton_line

    if fp8_gemm.fp8_tile_problem(_arch(cc), triton_line()) is None:  # the triton-fp8 path: its fixed tile
        from comfyui_ideogram4_int8.kernels import gemm_triton as T

        tile = fp8_gemm.fp8_tile(_arch(cc))
        for m, n, k in ((4608, 4608, 12288), (1000, 200, 1000)):  # the protected w2; a masked K tail
            q, w = torch.empty(m, k, dtype=torch.float8_e4m3fn), torch.empty(n, k, dtype=torch.float8_e4m3fn)
            out = torch.empty(m, n, dtype=torch.bfloat16)
            ((kernel, grid, args, kwargs),) = T.build_launches(q, w, tile, torch.empty(m), torch.empty(n), None, out)
            cases.append((f"fp8 GEMM {m}x{n}x{k}", kernel, grid, args, kwargs))
    for group in Q.ROTATION_GROUPS:  # ConvRot inside the quantizer (int8_convrot files)
        x = torch.empty(4608, 4608, dtype=torch.bfloat16)
        kernel, grid, args, kwargs = Q.build_rotated_launch(x, group)
        cases.append((f"quantize 4608x4608 rotated G={group}", kernel, grid, args, kwargs))
    qkv = torch.empty(1, 64, 3, 18, 256, dtype=torch.bfloat16)
    cs = torch.empty(64, 128)
    kernel, grid, args, kwargs = R.build_launch(qkv[:, :, 0], torch.empty(256), cs, cs, 1e-6)
    cases.append(("qk_norm_rope D=256", kernel, grid, args, kwargs))
    from comfyui_ideogram4_int8.kernels import rms_modulate_triton as M

    rows, vec = torch.empty(4608, 4608, dtype=torch.bfloat16), torch.empty(1, 4608, dtype=torch.bfloat16)
    for residual in (None, rows):  # the block's pre-norm and its gated residual
        kernel, grid, args, kwargs = M.build_launch(rows, residual, vec[0], vec, 4608, 1e-5, rows)
        cases.append((f"rms_modulate{' residual' if residual is not None else ''} C=4608", kernel, grid, args, kwargs))
    from comfyui_ideogram4_int8.kernels.gemm_triton import reduce_launch

    for m in (1, 512):  # the split-K reduce; M = 1 is specialized to a constant (a block's modulation vector)
        ws, out = torch.empty(4, m, 18432, dtype=torch.int32), torch.empty(m, 18432, dtype=torch.bfloat16)
        kernel, grid, args, kwargs = reduce_launch(ws, torch.empty(m), torch.empty(18432), None, out, False)
        cases.append((f"split-K reduce 4 x {m}x18432", kernel, grid, args, kwargs))
    quantized = (torch.empty(4608, 4608, dtype=torch.int8), torch.empty(4608))  # the pre-norm's handoff
    kernel, grid, args, kwargs = M.build_launch(rows, None, vec[0], vec, 4608, 1e-5, rows, quantized)
    cases.append(("rms_modulate quantized C=4608", kernel, grid, args, kwargs))
    return cases


# -- the sweep ---------------------------------------------------------------------------------------


def check(name: str, kernel, args, kwargs, cc: int, expect: str | None, must: bool = True) -> dict:
    """Compile one launch and judge it. expect: 'wgmma', 'mma' (any int8 MMA), 'tma' (wgmma + TMA), 'e4m3' (fp8
    MMA on e4m3 operands) or None."""
    row = {"cc": cc, "case": name, "must": must}
    t0 = time.time()
    try:
        ck = compile_offline(kernel, args, kwargs, cc)
    except Exception as exc:  # noqa: BLE001 - reported as a row
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        row.update(status="FAIL", why=f"{type(exc).__name__}: {(lines[-1] if lines else '')[:240]}")
        row["secs"] = round(time.time() - t0, 1)
        return row
    f = ptx_facts(ck.asm["ptx"])
    c = cubin_facts(ck.asm["cubin"]) if "cubin" in ck.asm else {}
    problems = []
    if expect in ("wgmma", "tma") and not f["wgmma_s8"]:
        problems.append("no int8 wgmma in the PTX")
    if expect == "mma" and not (f["mma_sync_s8"] or f["wgmma_s8"] or f["tcgen05_i8"]):
        problems.append("no int8 MMA in the PTX")
    if expect == "e4m3" and not f["mma_e4m3"]:
        problems.append("no e4m3 MMA in the PTX")
    if expect == "tma" and not (f["tma_load"] and f["tma_store"]):
        problems.append("no TMA loads/stores in the PTX")
    if ck.metadata.shared > SMEM_LIMIT[cc]:
        problems.append(f"shared memory {ck.metadata.shared} B > {SMEM_LIMIT[cc]} B")
    if c.get("local"):
        problems.append(f"{c['local']} B of local memory (spills)")
    row.update(
        status="FAIL" if problems else "OK",
        why="; ".join(problems),
        smem=ck.metadata.shared,
        regs=c.get("regs"),
        mma=_mma_kind(f),
        wgmma=",".join(f["wgmma_shapes"]),
        tma=f"{f['tma_load']}L/{f['tma_store']}S",
    )
    row["secs"] = round(time.time() - t0, 1)
    return row


def sweep(archs=ARCHS, quick: bool = False, echo=print) -> list[dict]:
    import triton
    from comfyui_ideogram4_int8.kernels import backends

    gluon_on = backends.gluon_import_error() is None
    gluon_error = None
    try:
        from comfyui_ideogram4_int8.kernels import gemm_gluon

        gluon_error = gemm_gluon.IMPORT_ERROR
    except Exception as exc:  # noqa: BLE001
        gluon_error = f"{type(exc).__name__}: {exc}"
    echo(
        f"triton {triton.__version__}, torch {torch.__version__}, ptxas {'found' if ptxas_present() else 'MISSING'};"
        f" Gluon at run time: {'on' if gluon_on else backends.gluon_import_error()}"
    )
    rows = []
    for cc in archs:
        for cfg, epilogue in _configs(cc, quick):
            name = f"{cfg.key()} [{epilogue}]"
            if cfg.is_gluon and gluon_error:
                rows.append({"cc": cc, "case": name, "must": gluon_on, "status": "SKIP", "why": gluon_error})
                echo(_fmt(rows[-1]))
                continue
            try:
                launches = gemm_launches(cfg, epilogue, cc)
            except Exception as exc:  # noqa: BLE001
                rows.append({"cc": cc, "case": name, "must": True, "status": "FAIL", "why": f"host: {exc}"})
                echo(_fmt(rows[-1]))
                continue
            wgmma = cc == 90 and cfg.uses_wgmma_on_hopper()
            expect = "tma" if cfg.is_gluon else "wgmma" if wgmma else "mma"
            for i, (kernel, _grid, args, kwargs) in enumerate(launches):
                rows.append(
                    check(
                        name + (" reduce" if i else ""),
                        kernel,
                        args,
                        kwargs,
                        cc,
                        expect if i == 0 else None,
                        must=gluon_on or not cfg.is_gluon,
                    )
                )
                echo(_fmt(rows[-1]))
        for name, kernel, _grid, args, kwargs in other_launches(cc):
            rows.append(check(name, kernel, args, kwargs, cc, "e4m3" if name.startswith("fp8 GEMM") else None))
            echo(_fmt(rows[-1]))
    return rows


def _fmt(r: dict) -> str:
    status = r["status"] if r["must"] or r["status"] == "OK" else "INFO"
    head = f"sm_{r['cc']:<3} {status:<5} {r['case']:<58}"
    if r["status"] != "OK":
        return f"{head} {r.get('why', '')}"
    return (
        f"{head} {r['mma']:<8} {r['wgmma'][:12]:<12} {r['tma']:<7} smem {r['smem']:>6}  regs {r['regs']!s:>4}"
        f"  {r['secs']:>5.1f}s"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), choices=ARCHS)
    ap.add_argument("--quick", action="store_true", help="one config per kernel family")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # the kernel modules pick interpreter variants at import: compile what a GPU runs, in a clean process
        print("unset TRITON_INTERPRET: the offline compile builds the GPU variants of the kernels", file=sys.stderr)
        return 2
    if not ptxas_present():
        print("triton's bundled ptxas is missing: nothing can be compiled offline", file=sys.stderr)
        return 1
    t0 = time.time()
    rows = sweep(args.arch, args.quick)
    bad = [r for r in rows if r["status"] != "OK" and r["must"]]
    info = [r for r in rows if r["status"] != "OK" and not r["must"]]
    print(
        f"{len(rows) - len(bad) - len(info)}/{len(rows)} OK, {len(bad)} failed, {len(info)} informational "
        f"in {time.time() - t0:.0f} s"
    )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
