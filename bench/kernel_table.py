"""Per-kernel tables of one sampling step, and the difference between two of them (issue: the eager gap between the
ComfyUI path and the reference DiT).

``table(prof, steps)`` turns a ``torch.profiler`` run into ``{kernel: {"count", "ms"}}`` per step, device kernels and
copies only (on a CPU run: the operators, so the code is testable without a GPU); names are normalized (template
arguments and numbers folded) so one kernel's launches of different shapes and tunings meet in one row.
``bench/e2e.py`` (reference DiT: one bare step call) and ``bench.comfy --vram 0 --kernels`` (ComfyUI path: steps
from the middle of a run, ``bench/step_profile.py``) write a step's table into their JSON, each measured in its own
process, with a ``profile`` entry saying which steps it covers; the ComfyUI path adds ``per_run``, what its run had
beyond its steps (``beyond_steps``, ``bus_beyond``);

    python -m comfyui_ideogram4_int8.bench.kernel_table REF.json:runs/triton-int8 COMFY.json:runs/ours-w8a8@resident

prints what one runs and the other does not, the largest differences first, with each side's busy time per step and
the steps it covers, then each side's once-per-run work where it has any. Each argument is a file and a key path in
it (reference-DiT results written before their entries moved to ``runs`` have them under ``paths``).

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
        if device != ("CUDA" in str(getattr(evt, "device_type", ""))) or evt.key.startswith("ProfilerStep"):
            continue  # (the profiler's own mark of a scheduled step)
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
        row["count"] += count
        row["ms"] += us / 1e3
    return scaled(out, steps)


def scaled(total: dict[str, dict[str, float]], steps: int) -> dict[str, dict[str, float]]:
    """The totals of ``steps`` steps (``table(prof)``) per step, rounded as ``table`` rounds."""
    return {k: {"count": round(v["count"] / steps, 2), "ms": round(v["ms"] / steps, 4)} for k, v in total.items()}


def summed(*tables: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for t in tables:
        for k, v in t.items():
            row = out.setdefault(k, {"count": 0.0, "ms": 0.0})
            row["count"] += v["count"]
            row["ms"] += v["ms"]
    return out


_NONE = {"count": 0.0, "ms": 0.0}


def beyond_steps(run: dict, profiled: dict, profiled_steps: int, run_steps: int, top: int = 20) -> dict:
    """What a run of ``run_steps`` steps (``run``: its totals) ran beyond ``run_steps`` times the per-step rate of its
    ``profiled_steps`` profiled ones (``profiled``: their totals): ``kernels``, the kernels launched more (or fewer)
    times than that rate gives, with those launches' time, the ``top`` largest (the run's set-up, a copy made once per
    run, a first step's capture); ``launches_ms``, their time; ``timing_ms``, the rest of the run's kernel time
    beyond that rate (the same launches, slower or faster than in the profiled steps)."""
    rows, timing = {}, 0.0
    for name in set(run) | set(profiled):
        r, p = run.get(name, _NONE), profiled.get(name, _NONE)
        count = r["count"] - run_steps * p["count"] / profiled_steps
        ms = r["ms"] - run_steps * p["ms"] / profiled_steps
        if abs(count) >= 0.5:
            rows[name] = {"count": round(count, 2), "ms": round(ms, 4)}
        else:
            timing += ms
    return {
        "kernels": dict(sorted(rows.items(), key=lambda kv: (-abs(kv[1]["ms"]), kv[0]))[:top]),
        "launches_ms": round(sum(r["ms"] for r in rows.values()), 3),
        "timing_ms": round(timing, 3),
    }


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


BUS_TIMES = ("span_ms", "bus_busy_ms", "bus_idle_ms", "compute_busy_ms", "both_idle_ms")


def bus_beyond(outside: dict[str, dict], per_step: dict, steps: int, top: int = 8) -> dict:
    """The parts of a run outside its profiled steps (``outside``: part name -> ``bus`` of that part's timeline, as
    totals) beyond ``steps`` (the steps those parts held) times the per-step ``per_step``: each time of ``bus``, and
    the largest idle stretches of the bus in those parts, each ``bus``'s gap with its part's name added."""
    out = {}
    for key in BUS_TIMES:
        out[key] = round(sum(b.get(key, 0.0) for b in outside.values()) - steps * per_step.get(key, 0.0), 2)
    gaps = [[*g, part] for part, b in outside.items() for g in b.get("gaps", [])]
    out["gaps"] = sorted(gaps, key=lambda g: -g[0])[:top]
    return out


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


def coverage(profile: dict | None) -> str:
    """Which steps a result's per-step tables come from (its ``profile`` entry), in words."""
    if not profile:
        return "profiled steps not recorded: an older result"
    if "run_steps" in profile:
        first, last = profile["steps"]
        steps = f"step {first}" if first == last else f"steps {first}-{last}"
        return f"{steps} of a {profile['run_steps']}-step run"
    calls = profile.get("step_calls", 1)
    return f"{calls} bare step call{'s' if calls != 1 else ''}"


def format_diff(
    a_name: str, a: dict, b_name: str, b: dict, top: int = 40, covers: tuple[str, str] | None = None
) -> str:
    """The ``diff`` of two per-step tables; ``covers``: the steps each comes from (``coverage``)."""
    ac, bc = (f" ({c})" for c in covers) if covers else ("", "")
    lines = [
        f"A = {a_name}: {busy_ms(a):.1f} ms of kernels per step{ac}",
        f"B = {b_name}: {busy_ms(b):.1f} ms of kernels per step{bc}",
        f"{'kernel':<90}{'A n':>7}{'A ms':>9}{'B n':>7}{'B ms':>9}{'B-A ms':>9}",
    ]
    for name, an, ams, bn, bms, d in diff(a, b, top):
        lines.append(f"{name[:89]:<90}{an:>7g}{ams:>9.3f}{bn:>7g}{bms:>9.3f}{d:>+9.3f}")
    return "\n".join(lines)


def format_per_run(side: str, node: dict, top: int = 12) -> str:
    """A result's once-per-run work (``per_run``: ``beyond_steps`` and ``bus_beyond``), or "" where it has none."""
    per_run, profile = node.get("per_run"), node.get("profile") or {}
    if not per_run:
        return ""
    steps = profile.get("run_steps", "?")
    lines = [
        f"{side} per run, beyond {steps} x its per-step table: {per_run['launches_ms']:.3f} ms in launches the steps "
        f"do not account for; the same kernels {per_run['timing_ms']:+.3f} ms",
        f"{'kernel':<90}{'launches':>9}{'ms':>10}",
    ]
    for name, row in list(per_run["kernels"].items())[:top]:
        lines.append(f"{name[:89]:<90}{row['count']:>+9g}{row['ms']:>+10.3f}")
    b = per_run.get("bus")
    if b:
        lines.append(
            f"{side} bus per run, beyond {steps} x per step: span {b['span_ms']:+.2f} ms, bus busy "
            f"{b['bus_busy_ms']:+.2f}, compute {b['compute_busy_ms']:+.2f}, neither {b['both_idle_ms']:+.2f}"
        )
        for ms, at, kernel, host, part in b["gaps"][:3]:
            blocked = f", the host in {host}" if host else ""
            lines.append(
                f"  bus idle {ms} ms in the part {part} the profiled steps, {at} ms in, while {kernel} ran{blocked}"
            )
    return "\n".join(lines)


def load(spec: str) -> tuple[str, dict]:
    """``FILE.json:key/key`` -> (label, the entry found under that key path: its ``kernels`` table, ``profile``,
    ``per_run``)."""
    path, _, keys = spec.partition(":")
    node = json.loads(pathlib.Path(path).read_text())
    for key in filter(None, keys.split("/")):
        if key not in node:
            raise SystemExit(f"{spec}: no {key!r} here; there are {sorted(node)[:20]}")
        node = node[key]
    if "kernels" not in node:
        raise SystemExit(f"{spec}: no 'kernels' table (run the benchmark with --kernels)")
    return keys or path, node


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m comfyui_ideogram4_int8.bench.kernel_table", description=__doc__)
    p.add_argument("a", help="FILE.json:key/path of the first table (e.g. the reference DiT)")
    p.add_argument("b", help="FILE.json:key/path of the second (e.g. the ComfyUI path)")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    (an, a), (bn, b) = load(args.a), load(args.b)
    covers = (coverage(a.get("profile")), coverage(b.get("profile")))
    print(format_diff(an, a["kernels"], bn, b["kernels"], args.top, covers))
    for side, node in (("A", a), ("B", b)):
        text = format_per_run(side, node)
        if text:
            print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
