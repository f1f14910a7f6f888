import argparse

import pytest

from hifc.analysis import register_all


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hifc")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register_all(subparsers)
    return parser


@pytest.fixture
def cli():
    """Run `hifc <argv>` through the registrars; returns the exit code (argparse errors: 2)."""
    def run(*argv) -> int:
        parser = build_parser()
        try:
            args = parser.parse_args([str(arg) for arg in argv])
        except SystemExit as exc:
            return exc.code
        return args.func(args)
    return run
