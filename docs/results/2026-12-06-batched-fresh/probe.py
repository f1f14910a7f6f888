"""Fresh prompt chunks of one padded length attended in one batched cuDNN call, against the
TMA prompt kernel on the paged cache (what such a step runs today) and one cuDNN call per chunk;
8B heads, bf16. Times are device time per call with the host's launches queued behind a sleep
(so host overhead does not count), copies into and out of the batched layout included. Also the
first call of each batched shape (its graph build). Prints one JSON line per case."""
import json, sys, time
sys.path.insert(0, "scripts")
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import gpu_kernel_probe as P
from hifc.layers import triton_prompt_attention as TPA

dev, dt = torch.device("cuda"), torch.bfloat16
hq, hkv, d = 32, 8, 128
scale = d ** -0.5
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
      torch.cuda.get_device_name(), flush=True)


def device_ms(fn, reps=20):
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = None
    for _ in range(3):
        torch.cuda._sleep(200_000_000)  # ~0.1 s: the launches below queue behind it
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        t = start.elapsed_time(end) / reps
        best = t if best is None else min(best, t)
    return best


def causal(q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION], set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              enable_gqa=True)


# warm the kind (the first causal cuDNN call in a process compiles its kernel)
x = torch.zeros(1, hq, 512, d, device=dev, dtype=dt)
t0 = time.perf_counter(); causal(x, x[:, :hkv], x[:, :hkv]); torch.cuda.synchronize()
print("first causal call", round(time.perf_counter() - t0, 3), "s", flush=True)

cases = [(8, 1024), (16, 1024), (4, 1024), (16, 512), (32, 512), (8, 512), (4, 2048),
         (8, 2048), (2, 4096), (1, 8192), (1, 1024), (2, 1024)]
ragged = [1024, 1000, 900, 1024, 800, 1024, 1017, 950]
rows = []
for b, L in cases + [("ragged", 1024)]:
    lens = ragged if b == "ragged" else [L] * b
    nb = len(lens)
    kv, tables, all_k, all_v = P.build_cache(lens, hkv, d, dt, dev)
    meta = P.meta_for(lens, lens, tables, dev)
    T = sum(lens)
    q = torch.randn(T, hq, d, device=dev, dtype=dt)
    qkv = torch.randn(T, (hq + 2 * hkv) * d, device=dev, dtype=dt)
    v_view = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
    v_view.copy_(all_v)
    k = all_k.contiguous()
    pairs = sum(n * (n + 1) // 2 for n in lens)
    flops = 4 * hq * d * pairs
    out = torch.empty_like(q)
    row = dict(case=f"{b} x {L}", chunks=nb, tokens=T, gflop=round(flops / 1e9, 2))

    def tma():
        TPA.prompt_attention(q, kv, meta, scale, out)
    tma()
    ref = out.clone()
    t = device_ms(tma)
    row["tma_ms"], row["tma_tflops"] = round(t, 4), round(flops / t / 1e9, 1)

    def per_chunk():
        start = 0
        for n in lens:
            heads = [x[start:start + n] for x in (q, k, v_view)]
            padded = []
            for x in heads:
                y = x.new_empty(L, *x.shape[1:])
                y[:n] = x
                y[n:].zero_()
                padded.append(y.transpose(0, 1).unsqueeze(0))
            o = causal(*padded)
            out[start:start + n] = o[0, :, :n].transpose(0, 1)
            start += n

    def batched():
        if all(n == L for n in lens):  # q and k in place, v copied (a view of the QKV output)
            qb = q.view(nb, L, hq, d).transpose(1, 2)
            kb = k.view(nb, L, hkv, d).transpose(1, 2)
            vb = v_view.contiguous().view(nb, L, hkv, d).transpose(1, 2)
        else:
            bufs = [x.new_zeros(nb, L, *x.shape[1:]) for x in (q, k, v_view)]
            start = 0
            for i, n in enumerate(lens):
                for buf, x in zip(bufs, (q, k, v_view)):
                    buf[i, :n] = x[start:start + n]
                start += n
            qb, kb, vb = (buf.transpose(1, 2) for buf in bufs)
        o = causal(qb, kb, vb)  # [nb, hq, L, d]
        if all(n == L for n in lens):
            out.view(nb, L, hq, d).copy_(o.transpose(1, 2))
        else:
            start = 0
            for i, n in enumerate(lens):
                out[start:start + n] = o[i, :, :n].transpose(0, 1)
                start += n
        return o

    torch.cuda.synchronize()
    t0 = time.perf_counter(); o = batched(); torch.cuda.synchronize()
    row["batched_first_s"] = round(time.perf_counter() - t0, 4)
    t0 = time.perf_counter(); batched(); torch.cuda.synchronize()
    row["batched_second_s"] = round(time.perf_counter() - t0, 4)
    row["batched_layout"] = [list(o.shape), list(o.stride())]
    row["batched_diff"] = (out.float() - ref.float()).abs().max().item()
    t = device_ms(batched)
    row["batched_ms"], row["batched_tflops"] = round(t, 4), round(flops / t / 1e9, 1)
    qb = q.view(nb, L, hq, d).transpose(1, 2) if all(n == L for n in lens) else None
    if qb is not None:
        kb = k.view(nb, L, hkv, d).transpose(1, 2)
        vb = v_view.contiguous().view(nb, L, hkv, d).transpose(1, 2)
        t = device_ms(lambda: causal(qb, kb, vb))
        row["cudnn_alone_ms"], row["cudnn_alone_tflops"] = round(t, 4), round(flops / t / 1e9, 1)
    if nb <= 16:
        per_chunk(); torch.cuda.synchronize()
        row["per_chunk_diff"] = (out.float() - ref.float()).abs().max().item()
        t = device_ms(per_chunk, reps=5)
        row["per_chunk_ms"], row["per_chunk_tflops"] = round(t, 4), round(flops / t / 1e9, 1)
    rows.append(row)
    print(json.dumps(row), flush=True)
    del kv, all_k, all_v, q, k, qkv, v_view, out
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
