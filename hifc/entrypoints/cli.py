"""``hifc`` command line: generate, bench, and the analysis tools."""
from __future__ import annotations

import argparse
import logging
import sys
import traceback

from hifc import analysis
from hifc.bench import cli as bench_cli
from hifc.entrypoints import generate, server
from hifc.entrypoints.user_errors import EXIT_USER_ERROR, USER_ERRORS, describe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hifc", description="LLM inference with flash KV swap")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also: serve --log-level debug)")
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
    except USER_ERRORS as exc:  # bad input found past argparse: a value, a path, a file
        print(f"hifc {args.command}: error: {describe(exc, args)}", file=sys.stderr)
        if args.debug or vars(args).get("log_level") == "debug":
            traceback.print_exc()
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
