"""HBM read rate against the copy rate, and decode attention's KV rate, on the H200."""
import sys, json
sys.path.insert(0, "scripts")
import torch, triton, triton.language as tl
import gpu_kernel_probe as P
from hifc.layers.triton_attention import TritonAttentionBackend, paged_attention

@triton.jit
def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = (i * nprog + pid) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))

dev = torch.device("cuda")
res = {}
res["copy_gbps"] = P.copy_rate(dev)
x = torch.ones(1 << 31, dtype=torch.bfloat16, device=dev)  # 4 GiB
nbytes = x.numel() * 2
res["torch_sum_gbps"] = nbytes / P.bench_ms(lambda: x.sum()) / 1e6
best = []
sms = torch.cuda.get_device_properties(dev).multi_processor_count
for block in (4096, 8192):
    for warps in (4, 8):
        for per_sm in (2, 4):
            progs = sms * per_sm
            iters = triton.cdiv(x.numel(), progs * block)
            out = torch.empty(progs, device=dev)
            try:
                t = P.bench_ms(lambda: _read[(progs,)](x, out, x.numel(), BLOCK=block, ITERS=iters, num_warps=warps))
                best.append((nbytes / t / 1e6, block, warps, per_sm))
            except Exception as e:
                print("fail", block, warps, per_sm, str(e)[:80])
best.sort(reverse=True)
res["triton_read_best"] = best[:6]
print(json.dumps(res, indent=1))
s = P.SHAPES["8b"]
backend = TritonAttentionBackend()
rows = []
for batch, ctx in ((1, 4096), (32, 4096), (32, 1100), (128, 4096)):
    q, meta, copies = P.decode_step(s, [ctx] * batch, dev, torch.bfloat16)
    plan = backend.plan(q, copies[0], meta)
    outs = [torch.empty_like(q) for _ in copies]
    scale = s["d"] ** -0.5
    t = P.graph_ms([lambda o=o, c=c: paged_attention(q, c, meta, scale, plan, o)
                    for o, c in zip(outs, copies)] * max(1, 32 // len(copies)))
    kvb = 2 * batch * ctx * s["hkv"] * s["d"] * 2
    rows.append(dict(batch=batch, ctx=ctx, plan=str(plan), us=round(t * 1e3, 2),
                     kv_gbps=round(kvb / t / 1e6), of_copy=round(kvb / t / 1e6 / res["copy_gbps"], 3)))
    print(rows[-1], flush=True)
    del copies
    torch.cuda.empty_cache()
