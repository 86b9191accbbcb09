"""One m64n256k32 int8 wgmma instead of two m64n128k32 halves: a PTX rewrite of the Gluon GEMM.

Why: an SS-form wgmma reads its A tile from shared memory once per instruction. A warpgroup that owns
a 64 x 256 int32 accumulator issues, per k32 step, two m64n128k32 instructions (Triton 3.6 lowers
int8 wgmma only up to n = 224, an assertion in its NVGPU-to-LLVM pass), so it reads A twice: 12 KB of
smem per step instead of 10 KB with one m64n256k32, which the PTX ISA and ptxas accept for .s8.

How: the kernel is compiled once as usual; in its PTX, every pair of m64n128k32 .s8 instructions with
the same A descriptor and scale-d predicate whose B descriptors lie exactly 128 rows apart (the lower
and upper halves of one [256, BLOCK_K] weight tile) becomes one m64n256k32 whose accumulator is the
lower half's 64 registers followed by the upper half's (the fragment layout orders registers by
column, 8 columns per 4 registers, so this is exactly the n = 256 layout). The rewritten PTX goes back
through Triton's own ``ir_override`` compile option (ptxas, metadata and launcher unchanged). Any
instruction that does not match the pattern aborts the rewrite (``MergeError``); the caller then runs
the kernel as compiled.
"""

from __future__ import annotations

import hashlib
import os
import re

_WGMMA = re.compile(
    r"^(?P<indent>\s*)wgmma\.mma_async\.sync\.aligned\.m64n(?P<n>\d+)k32\.s32\.s8\.s8 "
    r"\{(?P<regs>[^}]*)\}, (?P<a>%rd\d+), (?P<b>%rd\d+), (?P<p>%p\d+|[01]);\s*$"
)
# how Triton's lowering derives a k step's B descriptor: base descriptor plus (or'ed) a constant
_DESC_DEF = re.compile(r"^\s*(?:or|add)\.[bs]64\s+(%rd\d+), (%rd\d+), (\d+);")
HALF_N = 128


class MergeError(ValueError):
    """The PTX does not have the expected pairs of n = 128 halves."""


def merge_n128_pairs(ptx: str, row_bytes: int = 128) -> tuple[str, int]:
    """(rewritten PTX, number of merged pairs). ``row_bytes``: bytes per weight-tile row in shared
    memory (BLOCK_K int8 = 128 with the 128-byte swizzle); the descriptor's address field counts
    16-byte units, so the upper half starts ``HALF_N * row_bytes / 16`` after the lower one."""
    lines = ptx.split("\n")
    step = HALF_N * row_bytes >> 4
    defs = {}
    for ln in lines:
        m = _DESC_DEF.match(ln)
        if m:
            defs[m.group(1)] = (m.group(2), int(m.group(3)))
    found = [(i, _WGMMA.match(ln)) for i, ln in enumerate(lines) if "wgmma.mma_async" in ln]
    if not found:
        raise MergeError("no wgmma.mma_async in the PTX")
    bad = [i for i, m in found if m is None or int(m.group("n")) != HALF_N]
    if bad:
        raise MergeError(f"PTX line {bad[0] + 1}: not an m64n{HALF_N}k32 .s8 wgmma with descriptor operands")
    by_b = {}
    for i, m in found:
        if m.group("b") not in defs:
            raise MergeError(f"PTX line {i + 1}: B descriptor {m.group('b')} is not a base + constant")
        by_b.setdefault((m.group("a"), m.group("p"), *defs[m.group("b")]), []).append((i, m))
    replace, drop = {}, set()
    for i, m in found:
        if i in drop:
            continue
        base, off = defs[m.group("b")]
        upper = by_b.get((m.group("a"), m.group("p"), base, off + step), [])
        if len(upper) != 1 or upper[0][0] in replace:
            continue  # an upper half itself (its lower one claims it), or unpaired: checked below
        j, u = upper[0]
        lo, hi = m.group("regs").split(","), u.group("regs").split(",")
        if len(lo) != len(hi) or set(lo) & set(hi):
            raise MergeError(f"PTX lines {i + 1}/{j + 1}: accumulator halves overlap")
        replace[i] = (
            f"{m.group('indent')}wgmma.mma_async.sync.aligned.m64n{2 * HALF_N}k32.s32.s8.s8 "
            f"{{{','.join(lo + hi)}}}, {m.group('a')}, {m.group('b')}, {m.group('p')};"
        )
        drop.add(j)
    if 2 * len(replace) != len(found):
        raise MergeError(f"{len(found)} n = {HALF_N} wgmma, only {len(replace)} lower/upper pairs")
    out = [replace.get(i, ln) for i, ln in enumerate(lines) if i not in drop]
    return "\n".join(out), len(replace)


def override_path(ptx: str, cache_dir: str, row_bytes: int = 128) -> str:
    """Write the rewritten PTX under ``cache_dir`` (named by content, so Triton's compile cache, which
    keys on the option's path, can never pair a path with other contents); return the path."""
    merged, _ = merge_n128_pairs(ptx, row_bytes)
    digest = hashlib.sha256(merged.encode()).hexdigest()[:24]
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"w8a8_n256_{digest}.ptx")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(merged)
        os.replace(tmp, path)
    return path


def default_cache_dir() -> str:
    from triton import knobs

    return os.path.join(knobs.cache.dir, "ideogram4_int8_ptx")
