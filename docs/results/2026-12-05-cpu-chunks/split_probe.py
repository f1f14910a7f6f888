"""One prompt chunk after cached context, SmolLM2's attention shape (9 query heads, 3 KV heads
of 64), float32 on the CPU: one masked scaled_dot_product_attention call against hifc's
two-part path (``_attend_after_context``). Best of N calls, 2 threads. Run from the repo root:
``OMP_NUM_THREADS=2 PYTHONPATH=$PWD python docs/results/2026-12-05-cpu-chunks/split_probe.py``."""
import time

import torch
import torch.nn.functional as F

from hifc.layers.attention import _attend_after_context

torch.set_num_threads(2)
torch.manual_seed(0)


def masked(q, k, v, cached):
    seq_len = k.shape[2]
    visible = torch.arange(seq_len)[None, :] <= torch.arange(cached, seq_len)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=0.125,
                                          enable_gqa=True)


def best(f, *args, n):
    f(*args)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f(*args)
        times.append(time.perf_counter() - start)
    return min(times)


SHAPES = [(512, 512), (2048, 2048), (4096, 1024), (8192, 512), (1024, 4096), (16384, 2048),
          (100, 3000), (4096, 2), (4096, 16), (300, 40)]
SHAPES += [(cached, chunk) for cached in (64, 300, 2000) for chunk in (16, 32, 64, 128)]
print("cached  chunk    pairs   mask ms  split ms  mask/split  max |diff|")
for cached, chunk in SHAPES:
    q = torch.randn(1, 9, chunk, 64)
    k, v = torch.randn(2, 1, 3, cached + chunk, 64)
    diff = (masked(q, k, v, cached) - _attend_after_context(q, k, v, cached, 0.125)).abs().max()
    n = 3 if chunk * (cached + chunk) > 1 << 20 else 30
    a = best(masked, q, k, v, cached, n=n)
    b = best(_attend_after_context, q, k, v, cached, 0.125, n=n)
    print(f"{cached:6d} {chunk:6d} {chunk * (cached + chunk):8d} {a * 1e3:9.3f} {b * 1e3:9.3f}"
          f" {a / b:10.2f}  {diff:.1e}")
