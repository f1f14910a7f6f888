"""Decode attention plans at batch 32 over copies of the cache past L2 (8B heads), one stage
included: python3 attn_plans.py OUT.json. Prints us per launch sorted, per case."""
import itertools
import json
import sys

import torch

sys.path.insert(0, "scripts")
import gpu_kernel_probe as p  # noqa: E402
from hifc.layers.triton_attention import LaunchPlan, TritonAttentionBackend, paged_attention  # noqa: E402

dev, dtype = torch.device("cuda"), torch.bfloat16
s = p.SHAPES["8b"]
copy = p.copy_rate(dev)
print(f"copy {copy:.0f} GB/s", flush=True)
rows = []
for batch, context in ((32, 1100), (32, 4096), (24, 1100), (16, 1100)):
    q, meta, copies = p.decode_step(s, [context] * batch, dev, dtype)
    kv = copies[0]
    scale = s["d"] ** -0.5
    cur = TritonAttentionBackend().plan(q, kv, meta)
    floor_us = 2 * batch * context * s["hkv"] * s["d"] * 2 / copy / 1e3
    ref = paged_attention(q, kv, meta, scale, cur)
    plans = {"current": cur}
    for tile, segs, (w, st) in itertools.product((32, 64, 128), (1, 2, 4),
                                                 ((4, 1), (4, 2), (2, 1), (8, 1), (2, 2))):
        if tile == 128 and st == 2 and w == 2:
            continue
        plans[f"{tile}/{segs}/{w}w/{st}s"] = LaunchPlan(cur.block_m, cur.block_q, tile, segs, w, st)
    outs = [torch.empty_like(q) for _ in copies]
    case = []
    for key, plan in plans.items():
        try:
            out = paged_attention(q, kv, meta, scale, plan)
            t = p.graph_ms([lambda o=o, c=c, pl=plan: paged_attention(q, c, meta, scale, pl, o)
                            for o, c in zip(outs, copies)] * max(1, 32 // len(copies)))
            case.append({"batch": batch, "context": context, "plan": key, "detail": str(plan),
                         "us": t * 1e3, "over_floor": t * 1e3 / floor_us,
                         "max_diff": (out.float() - ref.float()).abs().max().item()})
        except Exception as e:  # noqa: BLE001
            case.append({"batch": batch, "context": context, "plan": key, "error": str(e)[:200]})
    case.sort(key=lambda r: r.get("us", 1e9))
    for r in case[:8] + [r for r in case if r["plan"] == "current"]:
        print(json.dumps(r), flush=True)
    rows += case
    del kv, copies
    torch.cuda.empty_cache()
json.dump({"copy_gbps": copy, "rows": rows}, open(sys.argv[1], "w"), indent=1)
