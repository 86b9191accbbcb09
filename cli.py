"""Command line: `python -m comfyui_ideogram4_int8 {demo,bench,info}`.

Subcommands import their heavy modules lazily so `--help` stays instant. A mistake on the command line ends in
one line that names the option and what it accepts (exit status 2), never in a traceback; so does Ctrl-C (one line,
exit status 130, the shell's status for an interrupt).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import tempfile

from .machine_info import INFO_ATTENTION, INFO_SHAPE, info_report

# ideogram4.schedule.PRESETS' names, spelled here so that `--help` needs no torch (a test keeps them equal)
PRESET_NAMES = ("Quality 48", "Default 20", "Turbo 12")
DEVICE_CHOICES = "cpu, cuda, cuda:N"
MAX_SEED = 2**64 - 1  # torch's generator takes a 64-bit seed (ComfyUI's seed widget has the same range)
# more torch threads than CPUs only wait on each other (thousands of them stall the machine)
MAX_THREADS = os.cpu_count() or 1
PROG = "python -m comfyui_ideogram4_int8"
INTERRUPTED = 130  # the exit status a shell gives a command stopped by Ctrl-C (128 + SIGINT)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line: ``<prog>: error: argument --x: ... (see --help)``."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _preset(value: str) -> str:
    key = value.replace(" ", "").replace("_", "").lower()
    for name in PRESET_NAMES:  # the same leniency as ideogram4.schedule.get_preset: 'turbo12', 'Turbo'
        if name.replace(" ", "").lower() == key or name.split()[0].lower() == key:
            return name
    raise argparse.ArgumentTypeError(
        f"invalid choice: {value!r} (choose from {', '.join(repr(n) for n in PRESET_NAMES)})"
    )


def _device(value: str) -> str:
    name = value.strip().lower()
    ok = name in ("cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())
    if not ok:
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {DEVICE_CHOICES})")
    if name.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"{value!r}: torch {torch.__version__} sees no CUDA GPU here (choose cpu, or leave --device out)"
            )
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"{value!r}: this machine has {torch.cuda.device_count()} CUDA device(s) (cuda:0 .. "
                f"cuda:{torch.cuda.device_count() - 1})"
            )
    return name


def _out_dir(value: str) -> str:
    path = pathlib.Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is a file, not a folder (give a folder to write into)")
    parent = path
    while not parent.exists():  # the nearest folder that exists must be writable, the rest is created
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r}: {str(parent)!r} is a file, so no folder can be made under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{value!r}: no permission to write in {str(parent)!r}")
    try:  # what the OS really allows there: /proc and /sys refuse files even to root, whom os.access lets through
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"{value!r}: cannot write files in {str(parent)!r} ({exc.strerror or exc}); give a folder of your own"
        ) from None
    return value


def _checked(convert, ok, what: str):
    """An argparse type: ``convert`` the text, keep it if ``ok``, else an error naming the value and ``what`` it must
    be."""

    def parse(value: str):
        try:
            v = convert(value)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"invalid value: {value!r} ({what})")
        return v

    return parse


_threads = _checked(int, lambda n: 1 <= n <= MAX_THREADS, f"a whole number 1..{MAX_THREADS}, this machine's CPUs")
_seed = _checked(int, lambda n: 0 <= n <= MAX_SEED, f"a whole number 0..{MAX_SEED}, as ComfyUI's seed")
_seconds = _checked(float, lambda t: math.isfinite(t) and t >= 0, "seconds, a number >= 0; 0: off")


def _cmd_info(args: argparse.Namespace) -> int:
    report = info_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    gpu = report["gpu"] or "none (torch sees no CUDA GPU)"
    if report["compute_capability"]:
        gpu += f", sm_{report['compute_capability'].replace('.', '')} ({report['arch']})"
    print(f"comfyui-ideogram4-int8 {report['version']}")
    print(f"  torch      {report['torch']}")
    print(f"  triton     {report['triton'] or 'not installed'}")
    print(f"  GPU        {gpu}")
    if report["compute_capability"]:
        print(f"  family     {report['arch']}: {report['family']}")
    n, k = INFO_SHAPE
    print(
        f"  GEMM path  {report['gemm_path']} on {report['device']}: {report['path_label']} "
        f"(an Ideogram 4 linear, N={n} K={k})"
    )
    print(f"    why      {report['gemm_path_reason']}")
    print(f"  backend    {report['backend']}: {report['backend_reason']}")
    if report["gemm_path"] == "triton-int8":
        print(f"  launches   cached compiled-kernel launches {report['cached_launches']}")
    print(
        f"  fp8 layers {report['fp8_protected_path']}: {report['fp8_protected_reason']} "
        "(protected layers stored fp8: the loader's protected_layers = fp8)"
    )
    attention = report["attention"]
    n, h, d = INFO_ATTENTION
    print(f"  attention  {attention['path']} (an Ideogram 4 attention, L={n}, {h} heads of {d})")
    print(f"    why      {attention['reason']}")
    check = report["self_check"]
    done = ", ".join(
        f"{r['family']} {'passed' if r['passed'] else 'FAILED: ' + r['why']}"
        + (" (earlier, cached)" if r["from_cache"] else f" ({r['seconds']:.2f} s)")
        for r in check["results"]
    )
    print(f"  self-check {done or 'none run'}; runs: {check['runs']}")
    print("  (--json for the same as JSON; IDEOGRAM4_INT8_GEMM_PATH forces a path)")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .ideogram4.demo import run_demo

    return run_demo(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.gemm import run_bench  # only when asked: the CLI imports no bench code at start

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Ideogram 4 W8A8 INT8: fused Triton GEMM tools.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p_info = sub.add_parser(
        "info", help="print GPU / torch / triton facts and the GEMM path and backend this machine gets, and why"
    )
    p_info.add_argument("--json", action="store_true", help="print the report as JSON")
    p_info.set_defaults(func=_cmd_info)

    p_demo = sub.add_parser(
        "demo",
        help="build a tiny Ideogram-4-architecture model, write it as W8A8, load it back and sample "
        "through the fused path; writes a labelled PNG preview and prints the GEMM-path table",
        description="Build a tiny Ideogram-4-architecture model pair, write it as a W8A8 checkpoint, load it back "
        "through the real reader, sample with the official asymmetric CFG and compare with the float model.",
    )
    p_demo.add_argument(
        "--out", type=_out_dir, default="demo_out", help="output folder, created if missing (default: demo_out)"
    )
    p_demo.add_argument("--seed", type=_seed, default=0, metavar="SEED", help=f"noise seed, 0..{MAX_SEED} (default: 0)")
    p_demo.add_argument(
        "--preset",
        type=_preset,
        default="Turbo 12",
        metavar="PRESET",
        help=f"sampling preset, one of: {', '.join(PRESET_NAMES)} (default: Turbo 12)",
    )
    p_demo.add_argument(
        "--device",
        type=_device,
        default=None,
        metavar="DEVICE",
        help=f"one of: {DEVICE_CHOICES} (default: cuda when available, else cpu)",
    )
    p_demo.add_argument(
        "--threads",
        type=_threads,
        default=None,
        metavar="N",
        help=f"CPU threads for torch, 1..{MAX_THREADS} (default on the CPU: one per physical core this process may "
        "use that other jobs do not keep busy, by the 1-minute load average; OMP_NUM_THREADS, when set, is kept)",
    )
    p_demo.set_defaults(func=_cmd_demo)

    p_bench = sub.add_parser(
        "bench",
        help="time whole W8A8 linears against bf16 / dequant / cuBLAS INT8 / FP8 / comfy-kitchen peers; ends with a "
        "report to paste (GPU, paths, self-check, ratios to cuBLAS bf16 and torch._int_mm per shape)",
    )
    p_bench.add_argument("--out", default=None, help="JSON results file (default: bench/results/gemm-<gpu>.json)")
    p_bench.add_argument("--shapes", default=None, help="comma list of shape names (default: all)")
    p_bench.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    p_bench.add_argument("--tune", action="store_true", help="first time every tile config per shape (table source)")
    p_bench.add_argument("--quant-sweep", action="store_true", help="also time the quantizer's launch variants")
    p_bench.add_argument(
        "--sustained",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="also time bf16 / FP8 / comfy-kitchen / ours under sustained load: each replayed back to back "
        "for SECONDS per round (the board at its power limit, as in a sampling loop); 0: off",
    )
    p_bench.add_argument(
        "--smooth",
        action="store_true",
        help="also time the whole linear with a SmoothQuant vector (the transformerlab layout): with the divide in the "
        "quantizer (unfolded) and with the activation already divided upstream (folded); FFN pairs: two dividing "
        "passes, w3's ratio divide, one shared folded vector",
    )
    p_bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    command = ""
    try:
        args = build_parser().parse_args(argv)
        command = f" {args.command}"
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}{command}: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
