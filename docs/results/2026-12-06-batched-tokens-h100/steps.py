"""The end-to-end workload (32 x 1,024 in, 128 out) three times on one engine: each step's wall
ms and the allocator's new device allocations, to find the one slow step."""
import json
import sys
import time

import torch

from hifc.bench.throughput import _warm_up, fixed_workload
from hifc.engine.gc_heap import frozen_heap
from hifc.engine.llm_engine import LLMEngine
from hifc.layers.dense_attention import FusedShapes
from hifc.layers.triton_jit import kernel_compiles
from hifc.sampling_params import RequestOutputKind, SamplingParams

budget = int(sys.argv[1]) if sys.argv[1] != "0" else None
extra = dict(a.split("=", 1) for a in sys.argv[3:])
import os
MODEL = os.environ.get("MODEL", "random:ds-r1-llama-8b")
IN, OUT = int(os.environ.get("IN", 1024)), int(os.environ.get("OUTLEN", 128))
CUDA = torch.cuda.is_available()
alloc = (lambda: torch.cuda.memory_stats()["num_device_alloc"]) if CUDA else (lambda: 0)
engine = LLMEngine.from_options(MODEL, max_num_batched_tokens=budget,
                                **{k: (v == "1") for k, v in extra.items()})
runs = []
_take = FusedShapes.take
events = []


def take(self, shapes, flops):  # record each step's shapes and whether it built new ones
    new = sorted({s[:3] for s in shapes if not self.seen.get(s)})
    t = _take(self, shapes, flops)
    events.append((len(steps) if "steps" in globals() else -1, t, new))
    return t


FusedShapes.take = take
with frozen_heap():
    for run in range(3):
        reqs, _ = fixed_workload(engine, IN, OUT, 32, seed=100 + run)
        if run == 0 and os.environ.get("PREWARM") == "1":  # one untimed step at the full budget
            fill, _ = fixed_workload(engine, IN, 1, engine.limits.max_num_batched_tokens // IN,
                                     seed=99)
            for i, r in enumerate(fill):
                engine.add_request(f"fill-{i}", r.prompt_token_ids,
                                   SamplingParams(max_tokens=1, temperature=0.0))
            while engine.has_unfinished_requests():
                engine.step()
        if run == 0:
            _warm_up(engine, "w", reqs)
        for i, r in enumerate(reqs):
            engine.add_request(f"r{run}-{i}", r.prompt_token_ids, SamplingParams(
                max_tokens=OUT, temperature=0.0, ignore_eos=True,
                output_kind=RequestOutputKind.FINAL_ONLY))
        steps = []
        compiles, events[:] = len(kernel_compiles()), []
        if CUDA:
            torch.cuda.synchronize()
        t0 = last = time.perf_counter()
        while engine.has_unfinished_requests():
            a0 = alloc()
            engine.step()
            now = time.perf_counter()
            steps.append((round((now - last) * 1000, 2),
                          alloc() - a0))
            last = now
        ms = [s for s, _ in steps]
        top = sorted(range(len(ms)), key=ms.__getitem__)[-6:]
        print(f"run {run}: {last - t0:.4f} s, {len(ms)} steps, out tok/s {32 * OUT / (last - t0):.1f}; "
              f"first 7 {steps[:7]}; slowest (index, ms, allocs) "
              f"{[(i, ms[i], steps[i][1]) for i in reversed(top)]}; last 2 {steps[-2:]}",
              flush=True)
        print("  compiles", [(c.kernel[:90], round(c.seconds, 3))
                             for c in kernel_compiles()[compiles:]], flush=True)
        print("  dense takes (step, taken, new shapes)", [e for e in events if e[1] or e[2]][:12],
              flush=True)
        runs.append({"elapsed_s": last - t0, "steps": steps})
with open(sys.argv[2], "w") as f:
    json.dump({"budget": budget, "extra": extra, "runs": runs}, f)
engine.close()
