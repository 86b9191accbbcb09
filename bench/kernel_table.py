"""Per-kernel tables of one sampling step, and the difference between two of them (issue: the eager gap between the
ComfyUI path and the reference DiT).

``table(prof, steps)`` turns a ``torch.profiler`` run into ``{kernel: {"count", "ms"}}`` per step, device kernels and
copies only (on a CPU run: the operators, so the code is testable without a GPU); names are normalized (template
arguments and numbers folded) so one kernel's launches of different shapes and tunings meet in one row.
``bench/e2e.py --kernels`` (reference DiT) and ``bench/comfy_e2e.py --vram 0 --kernels`` (ComfyUI path) write a
step's table into their JSON, each measured in its own process;

    python -m comfyui_ideogram4_int8.bench.kernel_table REF.json:paths/triton-int8 COMFY.json:runs/ours-w8a8@resident

prints what one runs and the other does not, the largest differences first, with each side's busy time per step.

``bus(prof, steps)`` reads the same run as a timeline (issue 26: a step that streams weights is as long as the bus is
busy, and every idle stretch of the bus is time lost): how long host-to-device copies kept the bus busy, how long it
sat idle, and where in the step (the compute kernel running when an idle stretch began), beside the compute
streams' own busy time and the time neither was busy (the host behind).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

_TEMPLATE = re.compile(r"<[^<>]*>")
_NUMBER = re.compile(r"\d+")


def normalize(name: str) -> str:
    """One row per kernel: template arguments and numbers folded (``gemm<128, 4>_kernel_12`` -> ``gemm<>_kernel_#``)."""
    prev = None
    while prev != name:  # nested templates, innermost first (a bracket-free mark, so the outer ones match next)
        prev, name = name, _TEMPLATE.sub("\x00", name)
    name = _NUMBER.sub("#", name).replace("\x00", "<>")
    return name if len(name) <= 140 else name[:137] + "..."


def events(prof, device: bool = True):
    """``(raw name, launches, us)`` of a profiler run: device kernels and copies with their device time
    (``device``), else every operator with its own CPU time; events without time left out."""
    for evt in prof.key_averages():
        if device != ("CUDA" in str(getattr(evt, "device_type", ""))):
            continue
        if device:
            t = getattr(evt, "device_time_total", None)
            us = float(t if t is not None else getattr(evt, "cuda_time_total", 0.0))
        else:
            us = float(evt.self_cpu_time_total)
        if us > 0:
            yield evt.key, evt.count, us


def table(prof, steps: int = 1, device: bool = True) -> dict[str, dict[str, float]]:
    """``{normalized kernel name: {"count": launches per step, "ms": time per step}}`` of a profiler run over
    ``steps`` steps (``events``)."""
    out: dict[str, dict[str, float]] = {}
    for name, count, us in events(prof, device):
        row = out.setdefault(normalize(name), {"count": 0.0, "ms": 0.0})
        row["count"] += count / steps
        row["ms"] += us / 1e3 / steps
    return {k: {"count": round(v["count"], 2), "ms": round(v["ms"], 4)} for k, v in out.items()}


def spans(prof) -> list[tuple[str, float, float]]:
    """``(name, start us, end us)`` of every device kernel and copy of a profiler run, in start order."""
    out = []
    for evt in prof.events():
        if "CUDA" in str(getattr(evt, "device_type", "")) and evt.time_range.end > evt.time_range.start:
            out.append((evt.name, float(evt.time_range.start), float(evt.time_range.end)))
    return sorted(out, key=lambda s: s[1])


def host_calls(prof, min_us: float = 200.0) -> list[tuple[str, float, float]]:
    """``(name, start us, end us)`` of the CUDA runtime calls of a profiler run (CUPTI records them with the device's
    activity) that lasted at least ``min_us``: a host blocked in one (a synchronize, an allocation under memory
    pressure, a copy from pageable memory) is a host that stopped feeding the device."""
    out = []
    for evt in prof.events():
        name, r = evt.name, evt.time_range
        if "CUDA" not in str(getattr(evt, "device_type", "")) and name.startswith("cuda") and r.end - r.start >= min_us:
            out.append((name, float(r.start), float(r.end)))
    return sorted(out, key=lambda s: s[1])


def _union(ranges: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(ranges) -> float:
    return sum(b - a for a, b in ranges)


def is_upload(name: str) -> bool:
    """A host-to-device copy (what streaming puts on the bus)."""
    return name.startswith("Memcpy HtoD")


def bus(
    timeline: list[tuple[str, float, float]],
    steps: int = 1,
    top: int = 8,
    min_gap_us: float = 50.0,
    host: list[tuple[str, float, float]] = (),
) -> dict:
    """The bus and the compute streams over ``timeline`` (``spans``), per step: ``span_ms`` (first to last device
    event), ``bus_busy_ms`` / ``bus_idle_ms`` (host-to-device copies; idle = the span minus busy),
    ``compute_busy_ms`` (kernels and other copies), ``both_idle_ms`` (neither: the device waited for the host), and
    where the bus sat idle: ``idle_at`` sums the idle stretches of at least ``min_gap_us`` by the compute kernel
    running when each began ("none" when no kernel ran), the ``top`` largest first; ``gaps`` the largest stretches
    themselves (ms, ms after the span's start, that kernel, the longest ``host`` call overlapping it or "").
    ``host`` (``host_calls``): the long runtime calls, summed per name as ``host_blocked_ms``."""
    if not timeline:
        return {}
    start, end = min(s[1] for s in timeline), max(s[2] for s in timeline)
    copies = _union([(a, b) for n, a, b in timeline if is_upload(n)])
    compute_spans = [(n, a, b) for n, a, b in timeline if not is_upload(n)]
    compute = _union([(a, b) for _, a, b in compute_spans])
    either = _union(copies + compute)
    idle, cursor = [], start
    for a, b in copies + [(end, end)]:
        if a - cursor >= min_gap_us:
            idle.append((cursor, a))
        cursor = max(cursor, b)

    def running(t: float) -> str:  # the latest-starting kernel that covers t
        found = [n for n, a, b in compute_spans if a <= t < b]
        return normalize(found[-1]) if found else "none"

    def blocked_in(a: float, b: float) -> str:  # the host call overlapping [a, b] the longest
        best = max(((min(b, e) - max(a, s), n) for n, s, e in host if s < b and e > a), default=(0.0, ""))
        return best[1]

    at: dict[str, float] = {}
    gaps = []
    for a, b in idle:
        name = running(a)
        at[name] = at.get(name, 0.0) + (b - a)
        gaps.append((round((b - a) / 1e3, 3), round((a - start) / 1e3, 2), name, blocked_in(a, b)))
    blocked: dict[str, float] = {}
    for n, a, b in host:
        blocked[n] = blocked.get(n, 0.0) + (b - a)
    gaps.sort(key=lambda g: -g[0])
    per = 1e3 * steps
    return {
        "span_ms": round((end - start) / per, 2),
        "bus_busy_ms": round(_length(copies) / per, 2),
        "bus_idle_ms": round((end - start - _length(copies)) / per, 2),
        "compute_busy_ms": round(_length(compute) / per, 2),
        "both_idle_ms": round((end - start - _length(either)) / per, 2),
        "idle_at": {k: round(v / per, 3) for k, v in sorted(at.items(), key=lambda kv: -kv[1])[:top]},
        "gaps": [list(g) for g in gaps[:top]],
        "host_blocked_ms": {k: round(v / per, 3) for k, v in sorted(blocked.items(), key=lambda kv: -kv[1])[:top]},
    }


def busy_ms(kernels: dict[str, dict[str, float]]) -> float:
    return round(sum(v["ms"] for v in kernels.values()), 3)


def diff(a: dict, b: dict, top: int = 40) -> list[tuple[str, float, float, float, float, float]]:
    """Rows ``(kernel, a count, a ms, b count, b ms, b ms - a ms)``, the largest differences first (a kernel only
    one side runs has 0 on the other)."""
    rows = []
    for name in set(a) | set(b):
        ra, rb = a.get(name, {"count": 0, "ms": 0.0}), b.get(name, {"count": 0, "ms": 0.0})
        rows.append((name, ra["count"], ra["ms"], rb["count"], rb["ms"], round(rb["ms"] - ra["ms"], 4)))
    rows.sort(key=lambda r: (-abs(r[5]), r[0]))
    return rows[:top]


def format_diff(a_name: str, a: dict, b_name: str, b: dict, top: int = 40) -> str:
    lines = [
        f"A = {a_name}: {busy_ms(a):.1f} ms of kernels per step; B = {b_name}: {busy_ms(b):.1f} ms",
        f"{'kernel':<90}{'A n':>7}{'A ms':>9}{'B n':>7}{'B ms':>9}{'B-A ms':>9}",
    ]
    for name, an, ams, bn, bms, d in diff(a, b, top):
        lines.append(f"{name[:89]:<90}{an:>7g}{ams:>9.3f}{bn:>7g}{bms:>9.3f}{d:>+9.3f}")
    return "\n".join(lines)


def load(spec: str) -> tuple[str, dict]:
    """``FILE.json:key/key`` -> (label, the ``kernels`` table found under that key path)."""
    path, _, keys = spec.partition(":")
    node = json.loads(pathlib.Path(path).read_text())
    for key in filter(None, keys.split("/")):
        if key not in node:
            raise SystemExit(f"{spec}: no {key!r} here; there are {sorted(node)[:20]}")
        node = node[key]
    if "kernels" not in node:
        raise SystemExit(f"{spec}: no 'kernels' table (run the benchmark with --kernels)")
    return keys or path, node["kernels"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m comfyui_ideogram4_int8.bench.kernel_table", description=__doc__)
    p.add_argument("a", help="FILE.json:key/path of the first table (e.g. the reference DiT)")
    p.add_argument("b", help="FILE.json:key/path of the second (e.g. the ComfyUI path)")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    (an, a), (bn, b) = load(args.a), load(args.b)
    print(format_diff(an, a, bn, b, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
