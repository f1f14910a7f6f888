"""Relative error of the Triton backend's attention over a float8 cache against float32 attention
over the same (dequantised) cache: 8B heads (32 q, 8 KV, 128), bf16 q, decode and prefill."""
import math
import sys

import torch

from hifc.layers.triton_attention import TritonAttentionBackend
from tests.layers.test_triton_attention import fp8_step, make_step
from hifc.layers.attention import reference_paged_attention

label = sys.argv[1]
for name, qlens, ctx in (("decode b32 x 4096", [1] * 32, [4095] * 32),
                         ("decode b4 x 1100", [1] * 4, [1100] * 4),
                         ("prefill 512 after 1024", [512], [1024])):
    errs = []
    for seed in range(3):
        step = make_step(qlens, ctx, 32, 8, 128, 64, torch.bfloat16, seed=seed)
        q, k, v, cache, meta, kv_scale = fp8_step(step, seed)
        scale = 1.0 / math.sqrt(128)
        out = torch.full_like(q, float("nan"))
        TritonAttentionBackend().forward(q, k, v, cache, meta, scale, kv_scale=kv_scale, out=out)
        ref = reference_paged_attention(q.float(), cache, meta, scale, None, None, kv_scale)
        errs.append(((out.float() - ref).norm() / ref.norm()).item())
    print(f"{label:5s} {name:24s} rel err " + " ".join(f"{e:.3e}" for e in errs), flush=True)
