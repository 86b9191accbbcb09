"""Command line: `python -m comfyui_ideogram4_int8 {demo,bench,info}`.

Subcommands import their heavy modules lazily so `--help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_info(args: argparse.Namespace) -> int:
    from . import __version__
    from .kernels import environment_report

    report = {"version": __version__, **environment_report()}
    print(json.dumps(report, indent=2))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .ideogram4.demo import run_demo

    return run_demo(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.gemm import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m comfyui_ideogram4_int8",
        description="Ideogram 4 W8A8 INT8: fused Triton GEMM tools.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_info = sub.add_parser("info", help="print GPU / torch / triton facts and the GEMM path this machine gets")
    p_info.set_defaults(func=_cmd_info)

    p_demo = sub.add_parser(
        "demo",
        help="build a tiny Ideogram-4-architecture model, write it as W8A8, load it back and sample "
        "through the fused path; writes a PNG preview and prints the GEMM-path table",
    )
    p_demo.add_argument("--out", default="demo_out", help="output folder (default: demo_out)")
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.add_argument("--preset", default="Turbo 12", help="sampling preset (default: 'Turbo 12')")
    p_demo.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    p_demo.set_defaults(func=_cmd_demo)

    p_bench = sub.add_parser(
        "bench", help="time whole W8A8 linears against bf16 / dequant / cuBLAS INT8 / FP8 / comfy-kitchen peers"
    )
    p_bench.add_argument("--out", default=None, help="JSON results file (default: bench/results/gemm-<gpu>.json)")
    p_bench.add_argument("--shapes", default=None, help="comma list of shape names (default: all)")
    p_bench.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    p_bench.add_argument("--tune", action="store_true", help="first time every tile config per shape (table source)")
    p_bench.add_argument("--quant-sweep", action="store_true", help="also time the quantizer's launch variants")
    p_bench.add_argument(
        "--sustained", type=float, default=0.0, metavar="SECONDS",
        help="also time bf16 / FP8 / comfy-kitchen / ours under sustained load: each replayed back to back "
        "for SECONDS per round (the board at its power limit, as in a sampling loop); 0: off",
    )  # fmt: skip
    p_bench.add_argument(
        "--smooth", action="store_true",
        help="also time the whole linear with a SmoothQuant vector (the transformerlab layout): with the divide in the "
        "quantizer (unfolded) and with the activation already divided upstream (folded); FFN pairs: two dividing "
        "passes, w3's ratio divide, one shared folded vector",
    )  # fmt: skip
    p_bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
