"""Balanced split-K work lists for the Gluon GEMM's scheduled mode (llm_cond_proj: M ~ 512, K = 53248).

Why: plain split-K hands unit u = split * tiles + tile to CTA u % P. With 72 tiles x 5 splits = 360
units on 132 SMs, 96 CTAs run 3 units and 36 run 2: the last third of the kernel runs on 73% of
the SMs. More splits balance better but every unit costs a fixed drain + epilogue (~8 us measured,
bench/NOTES.md session 8), so split 7/9/11 were no faster.

What: about ``units_per_cta`` x P units, the tiles of each weight strip (pid_n) cut into S or S + 1
k ranges (all M tiles of a strip alike, so the CTAs that share a weight panel run the same k range
at the same time and read it once from HBM), handed out largest first to the least loaded CTA (a
unit costs its k steps plus ``UNIT_OVERHEAD_STEPS``), the cuts then refined by a local search.
Every CTA then runs about the same work. The partials are reduce-added into one zeroed int32 sum,
so any order is exact.

Table (int32 [P, 1 + 4 * U]): row p = [units of CTA p, then (pid_m, pid_n, k0, k steps) per unit].
"""

from __future__ import annotations

import heapq
import random

# a unit's fixed cost (drain + epilogue) in k steps: the best fit of GEMM time against the busiest
# CTA's load over four schedules (bench/results/probe-lpt-H100-2026-11-24-s8.log)
UNIT_OVERHEAD_STEPS = 8
REFINE_STEPS = 1500


def strip_splits(num_pid_m: int, num_pid_n: int, k_tiles: int, target_units: int) -> list[int]:
    """Splits per weight strip (pid_n): S or S + 1 so that num_pid_m x sum is about ``target_units``;
    the larger splits go to the later strips. Each split keeps >= 1 k step."""
    per_tile = max(1.0, target_units / (num_pid_m * num_pid_n))
    s = min(int(per_tile), k_tiles)
    extra = min(num_pid_n, round((target_units - num_pid_m * num_pid_n * s) / num_pid_m)) if s < k_tiles else 0
    extra = max(0, extra)
    return [s + (1 if n >= num_pid_n - extra else 0) for n in range(num_pid_n)]


def _units(bounds: list, num_pid_m: int) -> list:
    """Units (splits of its strip, piece, strip, M tile, k0, k steps), in hand-out order: largest
    first (strips of fewer splits), then piece, strip, M tile: the M tiles of one (strip, piece) go
    to CTAs of equal load, i.e. run at the same time and share the weight panel."""
    units = [
        (len(b) - 1, i, n, m, b[i], b[i + 1] - b[i])
        for n, b in enumerate(bounds)
        for i in range(len(b) - 1)
        for m in range(num_pid_m)
    ]
    units.sort(key=lambda u: u[:4])
    return units


def _assign(units: list, ctas: int, overhead: int) -> tuple[list, tuple[int, int]]:
    """Each unit to the least loaded CTA (load: k steps + ``overhead`` per unit); (rows, (max load,
    sum of squared loads))."""
    heap = [(0, p) for p in range(ctas)]
    rows = [[] for _ in range(ctas)]
    for _, _, n, m, k0, nk in units:
        load, p = heapq.heappop(heap)
        rows[p].append((m, n, k0, nk))
        heapq.heappush(heap, (load + nk + overhead, p))
    return rows, (max(x for x, _ in heap), sum(x * x for x, _ in heap))


def build(
    num_pid_m: int,
    num_pid_n: int,
    k_tiles: int,
    ctas: int,
    units_per_cta: float,
    overhead: int = UNIT_OVERHEAD_STEPS,
    refine_steps: int = REFINE_STEPS,
) -> tuple[list, int]:
    """(rows, U): rows[p] = [(pid_m, pid_n, k0, nk), ...] in run order for CTA p, U = max units per CTA.

    The strips start cut into equal pieces; then a seeded local search moves single piece boundaries
    by 1-3 k steps, keeping a move when the busiest CTA (then the spread) gets no worse: the equal
    cuts leave the busiest CTA ~4-6% over the mean, the search ~1-2% (llm_cond_proj on 132 SMs)."""
    splits = strip_splits(num_pid_m, num_pid_n, k_tiles, round(units_per_cta * ctas))
    bounds = [[round(k_tiles * i / s) for i in range(s + 1)] for s in splits]
    rows, score = _assign(_units(bounds, num_pid_m), ctas, overhead)
    rng = random.Random(0)
    for _ in range(refine_steps):
        n = rng.randrange(num_pid_n)
        b = bounds[n]
        if len(b) < 3:
            continue
        i = rng.randrange(1, len(b) - 1)
        moved = b[:i] + [b[i] + rng.choice((-3, -2, -1, 1, 2, 3))] + b[i + 1 :]
        if not moved[i - 1] < moved[i] < moved[i + 1]:
            continue
        bounds[n] = moved
        cand, cand_score = _assign(_units(bounds, num_pid_m), ctas, overhead)
        if cand_score <= score:
            rows, score = cand, cand_score
        else:
            bounds[n] = b
    return rows, max(len(r) for r in rows)


def check_cover(rows: list, num_pid_m: int, num_pid_n: int, k_tiles: int) -> None:
    """Every (tile, k step) exactly once, or ValueError: a missed or doubled step would be a wrong sum."""
    seen = {}
    for r in rows:
        for m, n, k0, nk in r:
            if nk < 1:
                raise ValueError(f"empty unit {(m, n, k0, nk)}")
            seen.setdefault((m, n), []).append((k0, nk))
    if len(seen) != num_pid_m * num_pid_n:
        raise ValueError(f"{len(seen)} of {num_pid_m * num_pid_n} tiles scheduled")
    for tile, ranges in seen.items():
        at = 0
        for k0, nk in sorted(ranges):
            if k0 != at:
                raise ValueError(f"tile {tile}: k steps from {at} to {k0} scheduled {'twice' if k0 < at else 'never'}")
            at = k0 + nk
        if at != k_tiles:
            raise ValueError(f"tile {tile}: k steps {at}..{k_tiles} never scheduled")


def table(rows: list, u: int) -> list[list[int]]:
    """The kernel's int32 rows: [count, (pid_m, pid_n, k0, nk) * U], zero padded."""
    out = []
    for r in rows:
        flat = [len(r)] + [v for unit in r for v in unit]
        out.append(flat + [0] * (1 + 4 * u - len(flat)))
    return out


def max_load(rows: list, overhead: int = UNIT_OVERHEAD_STEPS) -> int:
    """The busiest CTA's k steps plus unit overheads (what the schedule balances)."""
    return max(sum(nk + overhead for *_, nk in r) for r in rows)
