"""One result shape for the end-to-end benchmarks (``bench.e2e``, ``bench.comfy``), its ``info``, its tables.

A result, the JSON each writes with ``--out``::

    {"info": {"gpu": ..., "torch": ..., "triton": ..., "date": ..., "command": ..., <the run's settings>},
     "runs": {name: entry, ...}}

``bench.comfy`` without ``--vram`` names its entries ``"peers"`` (one in-process run a peer) where its ``--vram``
mode and ``bench.e2e`` name them ``"runs"``. ``info`` starts with ``run_info``'s keys: the GPU's name ("cpu"
without one), torch's and Triton's versions, the date and the command line that runs it again; each benchmark adds
its settings after them (``bench.comfy --vram``'s parent holds no GPU: it copies gpu, torch and triton from its
first child and has no date). An entry is one measured run under its name; one that failed is
``{..., "error": "<type>: <message>"}``, printed as FAILED by ``print_runs``. The entries' own keys:
``bench/comfy/report.py`` (ComfyUI), ``bench/e2e.py`` (the reference DiT).
"""

from __future__ import annotations

import datetime
import re
import sys
from collections.abc import Container, Iterable, Sequence

_PATH = re.compile(r"^(/|~|\.{1,2}[/\\]|[A-Za-z]:[/\\])|\\")  # absolute, home, relative or Windows paths


def shown_args(argv: list[str]) -> str:
    """``argv`` as a result shows it: an argument that is a path (or ``--flag=path``) keeps only its last part, so
    a report pasted into an issue does not carry the folders of the machine it ran on; anything else is kept."""

    def shown(arg: str) -> str:
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("-"):
            return f"{flag}={shown(value)}"
        if not _PATH.search(arg):
            return arg
        return re.split(r"[/\\]", arg.rstrip("/\\"))[-1] or arg

    return " ".join(shown(a) for a in argv)


def command(module: str) -> str:
    """This process's command line as ``python -m comfyui_ideogram4_int8.bench.<module> <arguments>``."""
    return f"python -m comfyui_ideogram4_int8.bench.{module} " + shown_args(sys.argv[1:])


def run_info(module: str, **settings) -> dict:
    """The ``info`` of a result: the platform, the date and ``command(module)``, then ``settings`` in their order."""
    import torch
    import triton

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        "command": command(module),
        **settings,
    }


def two_places(e: dict, key: str, unit: str = "") -> str:
    """``e[key]`` with two decimals (and ``unit``), or '-' where the run has no such value."""
    return f"{e[key]:.2f}{unit}" if key in e else "-"


def markdown_table(head: Sequence[str], rows: Iterable[Sequence], right: Container[int] = ()) -> list[str]:
    """A Markdown table's lines: the header ``head``, the rule under it (the columns whose index is in ``right``
    aligned right), then a line a row of ``rows``, each cell as ``str`` gives it. A row may stop short of the header
    (a failed run: its name and why), never run past it."""

    def line(cells: Sequence) -> str:
        if len(cells) > len(head):
            raise ValueError(f"a table row has {len(cells)} cells for {len(head)} columns: {list(cells)}")
        return "| " + " | ".join(str(c) for c in cells) + " |"

    rule = "|" + "".join("---:|" if i in right else "---|" for i in range(len(head)))
    return [line(head), rule, *(line(r) for r in rows)]


def print_runs(title: str, name_column, columns: str, runs: dict, row, failed: slice = slice(None, 100)) -> None:
    """A results table (every benchmark's): ``title`` after a blank line; the header, ``name_column``
    ((label, width)) then ``columns``; a line a run: its name, then ``row(entry)``, or FAILED and the ``failed``
    part of its error where it did not run."""
    label, width = name_column
    print(f"\n{title}")
    print(f"{label:<{width}}{columns}")
    for name, e in runs.items():
        if "error" in e:
            print(f"{name:<{width}} FAILED: {e['error'][failed]}")
        else:
            print(f"{name:<{width}}{row(e)}")
