"""The end-to-end workload's prefill phase under the profiler: python3 prefill_prof.py BUDGET OUT.json.
Runs the 32 x 1,024 workload once untimed, then again with the first steps profiled (CUDA
activity only) until every request has its first token, plus one step. Reports the window's
span, device-busy time, idle gaps, kernels by time, and each step() call's wall ms."""
import json
import os
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from hifc.bench.throughput import _warm_up, fixed_workload
from hifc.engine.llm_engine import LLMEngine
from hifc.sampling_params import RequestOutputKind, SamplingParams

budget = int(sys.argv[1])
engine = LLMEngine.from_options(os.environ.get("MODEL", "random:ds-r1-llama-8b"),
                                max_num_batched_tokens=budget)


def add(run, reqs):
    for i, r in enumerate(reqs):
        engine.add_request(f"r{run}-{i}", r.prompt_token_ids, SamplingParams(
            max_tokens=128, temperature=0.0, ignore_eos=True,
            output_kind=RequestOutputKind.CUMULATIVE))


reqs, _ = fixed_workload(engine, int(os.environ.get("IN", 1024)), 128, 32, seed=100)
_warm_up(engine, "w", reqs)
add(0, reqs)
while engine.has_unfinished_requests():
    engine.step()
reqs, _ = fixed_workload(engine, int(os.environ.get("IN", 1024)), 128, 32, seed=101)
add(1, reqs)
torch.cuda.is_available() and torch.cuda.synchronize()
first = set()
walls = []
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    t0 = time.perf_counter()
    extra = 0
    while len(first) < 32 or extra < 1:
        if len(first) == 32:
            extra += 1
        a = time.perf_counter()
        for out in engine.step():
            if out.outputs and out.outputs[0].token_ids:
                first.add(out.request_id)
        walls.append(round((time.perf_counter() - a) * 1e3, 2))
    torch.cuda.is_available() and torch.cuda.synchronize()
    total = time.perf_counter() - t0
while engine.has_unfinished_requests():
    engine.step()
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "t.json")
    prof.export_chrome_trace(path)
    events = [e for e in json.load(open(path))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
events.sort(key=lambda e: e["ts"])
start, end = events[0]["ts"], max(e["ts"] + e["dur"] for e in events)
busy, cur_s, cur_e, gaps = 0.0, None, None, []
prev = None
for e in events:
    s, f = e["ts"], e["ts"] + e["dur"]
    if cur_e is None or s > cur_e:
        if cur_e is not None:
            busy += cur_e - cur_s
            gaps.append((s - cur_e, prev["name"][:60], e["name"][:60], (cur_e - start) / 1e3))
        cur_s, cur_e = s, f
    else:
        cur_e = max(cur_e, f)
    prev = e
busy += cur_e - cur_s
by = {}
for e in events:
    n, c = by.get(e["name"], (0.0, 0))
    by[e["name"]] = (n + e["dur"], c + 1)
top = sorted(by.items(), key=lambda kv: -kv[1][0])[:30]
gaps.sort(reverse=True)
res = {"budget": budget, "wall_s": total, "steps": len(walls), "step_wall_ms": walls,
       "span_ms": (end - start) / 1e3, "busy_ms": busy / 1e3,
       "idle_ms": (end - start - busy) / 1e3, "gaps_over_20us": sum(1 for g in gaps if g[0] > 20),
       "idle_in_gaps_over_20us_ms": sum(g[0] for g in gaps if g[0] > 20) / 1e3,
       "largest_gaps": [(round(g[0], 1), g[1], g[2], round(g[3], 2)) for g in gaps[:15]],
       "kernels": [{"name": n[:110], "ms": round(t / 1e3, 3), "calls": c} for n, (t, c) in top]}
print(json.dumps({k: v for k, v in res.items() if k != "kernels"}, indent=1))
for k in res["kernels"]:
    print(f"{k['ms']:10.3f} {k['calls']:6d}  {k['name']}")
json.dump(res, open(sys.argv[2], "w"), indent=1)
engine.close()
