"""dense_attention.warm_up on an 8B layer's cache shape in this process, each chunk timed:
python3 warm_kinds.py OUT.json"""
import json
import logging
import sys
import time

import torch

logging.basicConfig(level=logging.INFO)
from hifc.layers import dense_attention  # noqa: E402

cache = torch.zeros(2, 64, 64, 8, 128, dtype=torch.bfloat16, device="cuda")
a = time.perf_counter()
timed = dense_attention.warm_up(32, cache, 128 ** -0.5)
print("total", round(time.perf_counter() - a, 3), "s")
for c, n, t in timed:
    print(f"context {c:5d} tokens {n:4d}: {t * 1e3:8.1f} ms")
json.dump([{"context": c, "tokens": n, "seconds": t} for c, n, t in timed], open(sys.argv[1], "w"))
