"""``hifc bench ...``: the benchmark commands."""
from __future__ import annotations

from hifc.bench import decode, init, io, kernels, parallel, serve, sweeps, throughput


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmarks (decode, kernels, throughput, parallel, sweep, io, init, serve)")
    bench = p.add_subparsers(dest="bench_command", required=True)
    decode.register(bench)
    kernels.register(bench)
    throughput.register(bench)
    parallel.register(bench)
    sweeps.register(bench)
    io.register(bench)
    init.register(bench)
    serve.register(bench)
