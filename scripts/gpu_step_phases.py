"""Where a step's time goes between the host and the device: JSON-schema and free requests of
``scripts/gpu_structured_bench.py``, with asynchronous scheduling.

    PYTHONPATH=$PWD python3 scripts/gpu_step_phases.py [--requests 64] [--max-tokens 96]
    PYTHONPATH=$PWD python3 scripts/gpu_step_phases.py --device cpu --requests 4 --max-tokens 8

One engine (bf16 and CUDA graphs on CUDA, float32 on the CPU) runs each kind once to warm up,
then once measured. Per step, the host phases are timed around the engine's calls (``step``,
the scheduler's ``schedule``, ``launch_forward``, ``_apply`` with its ``_update``,
``_constraints`` and ``launch_sampling``), and on CUDA the device's intervals by events
recorded before and after ``launch_forward`` and ``launch_sampling``: the forward, the wait for
the sampling's launch, the sampling, the wait for the next forward. While the device has
nothing else queued, an interval shows how fast the host queues its work, not device time.
Prints medians and means in ms per step; ``--json OUT`` writes them.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_structured_bench import conversations, params  # noqa: E402

from hifc import LLM  # noqa: E402

# device intervals: (event before, event after) -> name
INTERVALS = {("forward>", "forward<"): "forward", ("forward<", "sampling>"): "wait for sampling",
             ("sampling>", "sampling<"): "sampling", ("sampling<", "forward>"): "wait for forward"}


class Recorder:
    """Host durations by phase and CUDA events in launch order, while ``on``."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.on = False
        self.host: dict[str, list[float]] = defaultdict(list)
        self.events: list[tuple[str, torch.cuda.Event]] = []

    def timed(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.on:
                    self.host[name].append((time.perf_counter() - start) * 1e3)
        return wrapper

    def marked(self, name: str, fn):
        """``fn`` between two events (CUDA only)."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self._mark(name + ">")
            result = fn(*args, **kwargs)
            self._mark(name + "<")
            return result
        return wrapper

    def _mark(self, name: str) -> None:
        if self.on and self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append((name, event))

    def device(self) -> dict[str, list[float]]:
        torch.cuda.synchronize()
        out = defaultdict(list)
        for (a, start), (b, end) in zip(self.events, self.events[1:]):
            if (a, b) in INTERVALS:
                out[INTERVALS[a, b]].append(start.elapsed_time(end))
        return out

    def clear(self) -> None:
        self.host.clear()
        self.events.clear()


def instrument(llm: LLM, rec: Recorder) -> None:
    engine, runner = llm.engine, llm.engine.runner
    engine.step = rec.timed("step", engine.step)
    engine.swaps.schedule = rec.timed("schedule", engine.swaps.schedule)
    engine._apply = rec.timed("apply", engine._apply)
    engine._update = rec.timed("update", engine._update)
    engine._constraints = rec.timed("constraints", engine._constraints)
    runner.launch_forward = rec.timed("launch_forward",
                                      rec.marked("forward", runner.launch_forward))
    runner.launch_sampling = rec.timed("launch_sampling",
                                       rec.marked("sampling", runner.launch_sampling))


def summary(values: list[float]) -> dict:
    return {"n": len(values), "median_ms": statistics.median(values),
            "mean_ms": statistics.fmean(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--kv-cache-gib", type=float, default=4.0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if args.requests < 1 or args.max_tokens < 1:
        ap.error("--requests and --max-tokens must be positive")
    cuda = args.device.startswith("cuda")
    llm = LLM(args.model, device=args.device, dtype="bfloat16" if cuda else "float32",
              max_num_seqs=max(args.requests, 8), async_scheduling=True,
              kv_cache_gib=args.kv_cache_gib)
    rec = Recorder(cuda)
    instrument(llm, rec)
    convs = conversations(args.requests)
    results = {}
    for kind in ("json", "free"):
        p = params(kind, args.max_tokens)
        llm.chat(convs, p, use_tqdm=False)  # warm-up: grammar compile, every batch size
        rec.clear()
        rec.on = True
        start = time.perf_counter()
        outs = llm.chat(convs, p, use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        rec.on = False
        steps = len(rec.host["step"])
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        results[kind] = {
            "wall_ms": wall * 1e3, "tokens": tokens, "steps": steps,
            "host": {name: summary(v) for name, v in sorted(rec.host.items())},
            "device": ({name: summary(v) for name, v in rec.device().items()} if cuda else {})}
        print(f"\n{kind}: {wall * 1e3:.1f} ms, {tokens} tokens, {steps} steps, "
              f"{wall * 1e3 / steps:.2f} ms per step (the run's start and end included)")
        for where in ("host", "device"):
            for name, s in results[kind][where].items():
                print(f"  {where:6} {name:18} median {s['median_ms']:7.3f}  "
                      f"mean {s['mean_ms']:7.3f}  (n={s['n']})")
    llm.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "requests": args.requests,
                       "max_tokens": args.max_tokens, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
