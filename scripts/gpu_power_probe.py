"""Burst against sustained rates of one GPU, with its SM clock and power read by nvidia-smi.

An H200 holds 1,980 MHz for a burst of bf16 matmuls only: within a fraction of a second its
700 W limit lowers the SM clock, and the rate falls with it. The physical ideal of `hifc bench
throughput` and the prefill fractions of `hifc bench kernels` count prefill FLOPs at the burst
rate (``hifc.bench.probes.matmul_tflops``) and report the sustained one beside it
(``matmul_rates``); this probe shows where the difference comes from.

Usage, repo root:  PYTHONPATH=$PWD python3 scripts/gpu_power_probe.py [--seconds 3]

Phases, each timed with CUDA events and printed with the clock and power nvidia-smi sampled
(every 20 ms, ``hifc.bench.power``) while it ran:
  matmul    8192-cubed bf16 products: 10 after 3 warm-ups (the burst), then windows of 20
  layer     an 8B layer's four projections at 8,192 rows (an 8k prefill's products)
  copy      1 GiB device copies ((read + write) bytes / s): 10, then windows of 40
  8b-b32, 8b-b128, 32b-b128
            a decode layer's four projections (8B at 32 and 128 rows, 32B at 128) over
            copies of the layer round robin, weight GB/s
Each phase starts after a second idle, so its burst figure comes from a cool GPU.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hifc.bench.power import ClockSampler, describe

# (phase, rows, a layer's projections as (out, in) features, layer copies round robin)
DECODE_LAYERS = (
    ("8b-b32", 32, ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)), 16),
    ("8b-b128", 128, ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)), 16),
    ("32b-b128", 128, ((7168, 5120), (5120, 5120), (55296, 5120), (5120, 27648)), 8),
)


def event_ms(fn, repeats: int) -> float:
    """Mean ms of ``fn`` over ``repeats`` calls, timed on the device."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def phase(name: str, fn, work: float, unit: str, burst: int, window: int, seconds: float,
          device) -> None:
    """Burst rate over ``burst`` calls, then rates over windows of ``window`` calls for
    ``seconds``, with the SM clock and power nvidia-smi read meanwhile; ``work`` per call in
    FLOPs (TFLOP/s) or bytes (GB/s)."""
    scale = 1e9 if unit == "TFLOP/s" else 1e6
    fn()
    torch.cuda.synchronize()
    time.sleep(1.0)
    with ClockSampler(device, interval_ms=20) as clocks:
        rate = work / event_ms(fn, burst) / scale
        rates = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            rates.append(work / event_ms(fn, window) / scale)
    tail = rates[len(rates) // 3:]
    print(f"{name:8s} burst {rate:8.1f} {unit}   sustained median {statistics.median(tail):8.1f} "
          f"(min {min(tail):.1f}, max {max(tail):.1f}) over the last {len(tail)} of "
          f"{len(rates)} windows of {window}")
    print(f"{'':8s} {describe(clocks.summary())}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="sustained part per phase")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    dev, bf16 = torch.device("cuda"), torch.bfloat16

    n = 8192
    a, b = torch.randn(n, n, device=dev).to(bf16), torch.randn(n, n, device=dev).to(bf16)
    out = torch.empty(n, n, device=dev, dtype=bf16)
    phase("matmul", lambda: torch.matmul(a, b, out=out), 2 * n ** 3, "TFLOP/s", 10, 20,
          args.seconds, dev)
    del a, b, out

    x, xd = torch.randn(n, 4096, device=dev).to(bf16), torch.randn(n, 14336, device=dev).to(bf16)
    shapes = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
    ws = [torch.randn(o, i, device=dev).to(bf16) for o, i in shapes]

    def layer():
        for w in ws:
            torch.nn.functional.linear(xd if w.shape[1] == 14336 else x, w)
    phase("layer", layer, sum(2 * n * o * i for o, i in shapes), "TFLOP/s", 3, 8, args.seconds,
          dev)
    del x, xd, ws

    src = torch.ones(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    phase("copy", lambda: dst.copy_(src), 2 * src.numel(), "GB/s", 10, 40, args.seconds, dev)
    del src, dst

    for name, rows, shapes, copies in DECODE_LAYERS:
        layers = [[torch.randn(o, i, device=dev, dtype=bf16) for o, i in shapes]
                  for _ in range(copies)]
        inputs = {i: torch.randn(rows, i, device=dev, dtype=bf16) for _, i in shapes}
        turn = iter(range(1 << 62))

        def decode_layer(layers=layers, inputs=inputs, turn=turn):
            for w in layers[next(turn) % len(layers)]:
                torch.nn.functional.linear(inputs[w.shape[1]], w)
        phase(name, decode_layer, sum(2 * o * i for o, i in shapes), "GB/s", copies, 10 * copies,
              args.seconds, dev)
        del layers, inputs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
