"""``hifc bench ...``: the benchmark commands."""
from __future__ import annotations

from hifc.bench import decode, init, io, throughput


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmarks (decode, io, init)")
    bench = p.add_subparsers(dest="bench_command", required=True)
    decode.register(bench)
    throughput.register(bench)
    io.register(bench)
    init.register(bench)
