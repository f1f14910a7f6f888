"""Host time of the first and second call of each dense-attention shape in a fresh process (8B
heads, the engine's strided views): python3 cudnn_builds.py OUT.json"""
import json
import sys
import time

import torch

from hifc.layers.attention import attend_with_lse
from hifc.layers.dense_attention import _causal

dev, dt = torch.device("cuda"), torch.bfloat16
HQ, HKV, D = 32, 8, 128
scale = D ** -0.5
print("cudnn", torch.backends.cudnn.version(), flush=True)


def views(n):
    qkv = torch.randn(n, (HQ + 2 * HKV) * D, device=dev, dtype=dt)
    q = qkv[:, :HQ * D].view(n, HQ, D)
    k = qkv[:, HQ * D:(HQ + HKV) * D].view(n, HKV, D)
    v = qkv[:, (HQ + HKV) * D:].view(n, HKV, D)
    return (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))


def ctx(c):
    kv = torch.randn(2, c, HKV, D, device=dev, dtype=dt)
    return kv[0].transpose(0, 1).unsqueeze(0), kv[1].transpose(0, 1).unsqueeze(0)


def timed(fn):
    torch.cuda.synchronize()
    a = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round((time.perf_counter() - a) * 1e3, 2)


rows = []
cases = [("causal", 1024, 0), ("causal", 2048, 0), ("causal", 1016, 0), ("causal", 1000, 0),
         ("causal", 1016, 0), ("causal", 777, 0), ("causal", 4096, 0), ("causal", 3333, 0),
         ("causal", 8192, 0), ("causal", 8191, 0),
         ("lse causal", 512, 0), ("lse causal", 516, 0), ("lse causal", 301, 0),
         ("over context", 512, 4096), ("over context", 516, 4100), ("over context", 300, 9000),
         ("over context", 1016, 7168), ("causal", 1537, 0), ("over context", 700, 5003)]
for kind, n, c in cases:
    q, k, v = views(n)
    if kind == "causal":
        fn = lambda: _causal(q, k, v, scale)  # noqa: E731
    elif kind == "lse causal":
        fn = lambda: attend_with_lse(q, k, v, scale, causal=True)  # noqa: E731
    else:
        kc, vc = ctx(c)
        fn = lambda: attend_with_lse(q, kc, vc, scale, causal=False)  # noqa: E731
    first, second, third = timed(fn), timed(fn), timed(fn)
    rows.append({"kind": kind, "n": n, "context": c, "first_ms": first, "second_ms": second,
                 "third_ms": third})
    print(json.dumps(rows[-1]), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
