"""``hifc`` command line: generate, bench, and the analysis tools."""
from __future__ import annotations

import argparse
import logging
import sys

from hifc import analysis
from hifc.bench import cli as bench_cli
from hifc.entrypoints import generate, server


def build_parser() -> argparse.ArgumentParser:
    from hifc import __version__

    parser = argparse.ArgumentParser(prog="hifc", description="LLM inference with flash KV swap")
    parser.add_argument("--version", action="version", version=f"hifc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    generate.register(sub)
    bench_cli.register(sub)
    server.register(sub)
    analysis.register_all(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # bad input found past argparse (model path, prompt length, ...)
        print(f"hifc {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
