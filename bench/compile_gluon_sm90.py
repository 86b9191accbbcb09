"""Offline (no GPU) compile of the Gluon W8A8 GEMM for sm_90a: a CPU smoke check.

    python bench/compile_gluon_sm90.py [--all] [--raw] [--swiglu] [--splitk] [--dump DIR]

Builds each config's launch with CPU tensors (kernels/gemm_gluon.build_launch), runs the
Triton 3.6 pipeline to PTX and cubin (the wheel's bundled ptxas) for GPUTarget("cuda", 90, 32),
and prints instruction counts from the PTX: wgmma, TMA (cp.async.bulk.tensor), mbarrier,
setmaxnreg, plus registers / spills / shared memory from the cubin metadata.
--swiglu (implied by --all) adds the SwiGLU epilogue (bf16 out [M, N / 2]) of every config
that can run it (mode ws/pingpong/pipelined, epi_n | block_n / 2).
--splitk (implied by --all) adds the split-K variants (SPLITK_CONFIGS) at the llm_cond_proj shape
M 512, N 4608, K 53248: int32 partials into the workspace [S, M, N] through a 3-D TMA descriptor.
Exit status 1 if any config fails to compile.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time

import torch

TARGET = ("cuda", 90, 32)


def compile_offline(kernel, args, kwargs):
    """What JITFunction.run does up to the compile, minus the driver: the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget(*TARGET)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, opts)
    src = GluonASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def ptx_stats(ptx: str) -> dict:
    wgmma = sorted(set(re.findall(r"wgmma\.mma_async\.\S+", ptx)))
    return {
        "wgmma_shapes": wgmma,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "wgmma_wait": ptx.count("wgmma.wait_group"),
        "tma_load": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global", ptx)),
        "tma_store": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "cp.async.bulk.tensor": ptx.count("cp.async.bulk.tensor"),
        "tma_reduce_add": ptx.count("cp.reduce.async.bulk.tensor"),
        "mbarrier": ptx.count("mbarrier."),
        "setmaxnreg": sorted(
            set(" ".join(x.split()) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+\d+", ptx))
        ),
        "bar.sync": ptx.count("bar.sync") + ptx.count("barrier.sync"),
    }


def cubin_stats(cubin: bytes) -> dict:
    """Registers / local memory (spills) from the bundled cuobjdump, and SASS spill instructions."""
    import subprocess
    import tempfile

    import triton

    bindir = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            res = subprocess.run([bindir / "cuobjdump", "--dump-resource-usage", f.name], capture_output=True,
                                 text=True, timeout=60).stdout  # fmt: skip
            sass = subprocess.run([bindir / "cuobjdump", "-sass", f.name], capture_output=True, text=True,
                                  timeout=60).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            return {"error": str(exc)}
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", res)
    out = {
        "sass_spill_ops": len(re.findall(r"\b(?:STL|LDL)\b", sass)),
        "sass_GMMA": len(re.findall(r"\b[HI]GMMA\b", sass)),
    }
    if m:
        out.update(regs=int(m.group(1)), stack=int(m.group(2)), local=int(m.group(3)))
    return out


def report(ck, head: str, dump: str | None, stem: str, **extra_ptx) -> None:
    """Print one compiled kernel's OK line, PTX counts (plus ``extra_ptx``) and cubin resources;
    with ``dump``, write its PTX, TTGIR and cubin there as ``stem``.*."""
    print(f"OK   {head}")
    print(f"     ptx: {ptx_stats(ck.asm['ptx']) | extra_ptx}")
    print(f"     cubin: {cubin_stats(ck.asm['cubin']) if 'cubin' in ck.asm else {}}")
    if dump:
        d = pathlib.Path(dump)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.ptx").write_text(ck.asm["ptx"])
        (d / f"{stem}.ttgir").write_text(ck.asm["ttgir"])
        if "cubin" in ck.asm:
            (d / f"{stem}.cubin").write_bytes(ck.asm["cubin"])


def splitk_configs():
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    return list(G.SPLITK_PROBE_CONFIGS)


def compile_splitk(cfg, M=512, N=4608, K=53248):
    """(launch, CompiledKernel) of a split-K config at [M, N, K] (bf16 out, scales, bias)."""
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    q = torch.empty(M, K, dtype=torch.int8)
    w = torch.empty(N, K, dtype=torch.int8)
    out = torch.empty(M, N, dtype=torch.bfloat16)
    shape = G.workspace_shape(cfg, M, N, K)
    ws = torch.empty(shape, dtype=torch.int32) if shape else None
    launch = G.build_launch(q, w, torch.empty(M), torch.empty(N), torch.empty(N), out, cfg=cfg, num_sms=132, ws=ws)
    kernel, grid, args, kwargs = launch
    return launch, compile_offline(kernel, args, kwargs)


def configs(all_configs: bool):
    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    return list(G.PROBE_CONFIGS) if all_configs else [G.DEFAULT_CONFIG, G.GluonGemmConfig(mode="pipelined")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--all", action="store_true", help="every probe config (default: the default ws + pipelined)")
    ap.add_argument("--raw", action="store_true", help="also the RAW_INT32 variants")
    ap.add_argument("--swiglu", action="store_true", help="also the SwiGLU epilogue variants (--all implies it)")
    ap.add_argument("--splitk", action="store_true", help="also the split-K variants (--all implies it)")
    ap.add_argument("--dump", default=None, help="write each kernel's PTX, TTGIR and cubin here")
    a = ap.parse_args(argv)

    from comfyui_ideogram4_int8.kernels import gemm_gluon as G

    if G._IMPORT_ERROR:
        print("SKIP:", G._IMPORT_ERROR)
        return 0
    M, N, K = 4608, 13824, 4608  # qkv: only the grid depends on the shape
    q = torch.empty(M, K, dtype=torch.int8)
    w = torch.empty(N, K, dtype=torch.int8)
    sa = torch.empty(M, dtype=torch.float32)
    sb = torch.empty(N, dtype=torch.float32)
    bias = torch.empty(N, dtype=torch.float32)
    variants = [("bf16+bias", torch.bfloat16, False, True, False)]
    if a.raw:
        variants.append(("raw_int32", torch.int32, True, False, False))
    if a.swiglu or a.all:
        variants.append(("bf16_swiglu", torch.bfloat16, False, False, True))
    failed = 0
    for cfg in configs(a.all):
        for vname, dt, raw, has_bias, swiglu in variants:
            if swiglu and G.validate_swiglu(cfg) is not None:
                print(f"skip {cfg.key()} [{vname}]: {G.validate_swiglu(cfg)}")
                continue
            out = torch.empty(M, N // 2 if swiglu else N, dtype=dt)
            t0 = time.time()
            try:
                kernel, grid, args, kwargs = G.build_launch(
                    q, w, sa, sb, bias if has_bias else None, out, raw_int32=raw, cfg=cfg, num_sms=132,
                    swiglu=swiglu,
                )  # fmt: skip
                ck = compile_offline(kernel, args, kwargs)
            except Exception as exc:  # report and go on with the next config
                failed += 1
                print(f"FAIL {cfg.key()} [{vname}]: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                continue
            md = ck.metadata
            head = f"{cfg.key()} [{vname}] {time.time() - t0:.1f}s smem={md.shared}B warps={md.num_warps} grid={grid}"
            report(ck, head, a.dump, f"{cfg.key()}_{vname}")
    if a.splitk or a.all:
        for cfg in splitk_configs():
            t0 = time.time()
            try:
                (kernel, grid, args, kwargs), ck = compile_splitk(cfg)
            except Exception as exc:
                failed += 1
                print(f"FAIL {cfg.key()} [split-K]: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
                continue
            report(
                ck,
                f"{cfg.key()} [split-K int32 partials] {time.time() - t0:.1f}s smem={ck.metadata.shared}B "
                f"grid={grid} SPLIT_K={kwargs['SPLIT_K']} KPS={args[9]} ws box={list(args[2].block_shape)}",
                a.dump, f"{cfg.key()}_splitk",
                tma_store_3d=ck.asm["ptx"].count("cp.async.bulk.tensor.3d.global.shared"),
            )  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
