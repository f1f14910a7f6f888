"""Decode attention plans at batch 32 over cache copies (no L2 reuse), against the backend's."""
import sys, json, time
sys.path.insert(0, "scripts")
import torch
import gpu_kernel_probe as P
from hifc.layers.triton_attention import TritonAttentionBackend, paged_attention, LaunchPlan
from hifc.layers.triton_jit import deferred_compiles

dev = torch.device("cuda")
copy = P.copy_rate(dev)
s = P.SHAPES["8b"]
backend = TritonAttentionBackend()
scale = s["d"] ** -0.5
out_rows = []
shapes = ((32, 4096), (32, 1100))
setups = {}
for batch, ctx in shapes:
    q, meta, copies = P.decode_step(s, [ctx] * batch, dev, torch.bfloat16)
    cur = backend.plan(q, copies[0], meta)
    plans = [cur]
    for tile in (64, 128):
        for segs in (1, 2, 4, 8):
            for warps, stages in ((4, 2), (4, 3), (8, 2), (2, 2)):
                p = LaunchPlan(cur.block_m, cur.block_q, tile, segs, warps, stages, 1)
                if p != cur:
                    plans.append(p)
    setups[(batch, ctx)] = (q, meta, copies, cur, plans)
t = time.time()
with deferred_compiles():
    for q, meta, copies, cur, plans in setups.values():
        for plan in plans:
            paged_attention(q, copies[0], meta, scale, plan)
print(f"compiled in {time.time() - t:.1f} s", flush=True)
for (batch, ctx), (q, meta, copies, cur, plans) in setups.items():
    ref = paged_attention(q, copies[0], meta, scale, cur)
    kvb = 2 * batch * ctx * s["hkv"] * s["d"] * 2
    outs = [torch.empty_like(q) for _ in copies]
    rows = []
    for plan in plans:
        try:
            o = paged_attention(q, copies[0], meta, scale, plan)
            t = P.graph_ms([lambda o=o_, c=c, plan=plan: paged_attention(q, c, meta, scale, plan, o)
                            for o_, c in zip(outs, copies)] * max(1, 32 // len(copies)))
            rows.append(dict(batch=batch, ctx=ctx, plan=(plan.tile, plan.num_segments, plan.num_warps, plan.num_stages, plan.segment_tiles),
                             current=plan == cur, us=round(t * 1e3, 2), gbps=round(kvb / t / 1e6),
                             diff=round((o.float() - ref.float()).abs().max().item(), 4)))
        except Exception as e:
            rows.append(dict(batch=batch, ctx=ctx, plan=str(plan), error=str(e)[:100]))
    rows.sort(key=lambda r: r.get("us", 1e9))
    c = [r for r in rows if r.get("current")][0]
    print(f"batch {batch} ctx {ctx} copies {len(copies)}: current {c['plan']} {c['us']} us {c['gbps']} GB/s; best:", flush=True)
    for r in rows[:8]:
        print("   ", r, flush=True)
    out_rows += rows
json.dump(dict(copy_gbps=copy, rows=out_rows), open(sys.argv[1], "w"))
