"""Prompt-chunk launch plans of the paged attention kernel, timed alone on the GPU:
python3 probe.py OUT.json. 8B attention shapes (32 query heads, 8 KV heads, head_dim 128), bf16,
64-token blocks in a shuffled cache. For each step's prompt chunks, every (q-block rows, key
tile, warps, stages) plan that compiles, against the backend's plan: ms (triton do_bench, L2
cleared), TFLOP/s and the largest difference from the backend plan's output."""
import dataclasses
import itertools
import json
import sys

import torch
import triton.testing

from hifc.layers.attention import AttentionMetadata
from hifc.layers.triton_attention import TritonAttentionBackend, paged_attention

HQ, HKV, D, BLOCK = 32, 8, 128, 64
dev = torch.device("cuda")
dtype = torch.bfloat16
torch.manual_seed(0)

# (name, [(cached keys, new tokens)] per sequence)
CASES = {
    "fresh 8 x 1,024": [(0, 1024)] * 8,
    "8 after 1,016, 7 x 1,024, 1,000": [(1016, 8)] + [(0, 1024)] * 7 + [(0, 1000)],
    "1,024 after 1,024, 7 x 1,024": [(1024, 1024)] + [(0, 1024)] * 7,
    "532 after 8,192, 7,628": [(8192, 532), (0, 7628)],
    "2,048 after 16,384": [(16384, 2048)],
    "4,096 after 12,000, 4,096": [(12000, 4096), (0, 4096)],
    "fresh 16 x 512": [(0, 512)] * 16,
}


def case(spec):
    seq_lens = [c + n for c, n in spec]
    blocks = [-(-s // BLOCK) for s in seq_lens]
    total = sum(blocks)
    kv = torch.randn(2, total + 1, BLOCK, HKV, D, device=dev, dtype=dtype)
    perm = torch.randperm(total) + 1
    tables = torch.zeros(len(spec), max(blocks), dtype=torch.int32)
    at = 0
    for i, nb in enumerate(blocks):
        tables[i, :nb] = perm[at:at + nb]
        at += nb
    qsl = [0]
    for _, n in spec:
        qsl.append(qsl[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(qsl[-1], dtype=torch.long, device=dev),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables.to(dev), query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
        max_query_len=max(n for _, n in spec), max_seq_len=max(seq_lens), block_size=BLOCK)
    # q as the engine has it: a view of the fused QKV projection's output
    qkv = torch.randn(qsl[-1], (HQ + 2 * HKV) * D, device=dev, dtype=dtype)
    q = qkv[:, :HQ * D].view(-1, HQ, D)
    flops = sum(4 * HQ * D * (n * c + n * n / 2) for c, n in spec)
    return q, kv, meta, flops


def main(out_path):
    backend = TritonAttentionBackend(dense_prefill=False)
    scale = D ** -0.5
    rows = []
    for name, spec in CASES.items():
        q, kv, meta, flops = case(spec)
        base = backend.plan(q, kv, meta)
        out = torch.empty(q.shape, device=dev, dtype=dtype)
        ref = paged_attention(q, kv, meta, scale, base, out).clone()
        variants = [("backend", base)]
        for bm, tile, warps, stages in itertools.product((64, 128), (64, 128), (4, 8), (2, 3, 4)):
            p = dataclasses.replace(base, block_m=bm, block_q=bm // (HQ // HKV), tile=tile,
                                    num_warps=warps, num_stages=stages)
            if p != base:
                variants.append((f"{bm}/{tile}/{warps}w/{stages}s", p))
        for label, plan in variants:
            row = {"case": name, "variant": label, "plan": dataclasses.asdict(plan)}
            try:
                got = paged_attention(q, kv, meta, scale, plan, out)
                row["max_diff"] = (got.float() - ref.float()).abs().max().item()
                ms = triton.testing.do_bench(
                    lambda: paged_attention(q, kv, meta, scale, plan, out), warmup=10, rep=60)
                row.update(ms=ms, tflops=flops / ms / 1e9)
            except Exception as e:  # noqa: BLE001 - a plan that does not compile is a result
                row["error"] = str(e)[:160]
            rows.append(row)
        base_ms = rows[-len(variants)]["ms"]
        done = sorted((r for r in rows[-len(variants):] if "ms" in r), key=lambda r: r["ms"])
        print(f"\n{name}: backend {base.block_m}/{base.tile}/{base.num_warps}w/"
              f"{base.num_stages}s seg {base.num_segments} {base_ms * 1e3:.1f} us "
              f"({flops / base_ms / 1e9:.0f} TFLOP/s)")
        for r in done[:6]:
            print(f"  {r['variant']:>14} {r['ms'] * 1e3:8.1f} us {r['tflops']:6.0f} TFLOP/s "
                  f"x{r['ms'] / base_ms:.3f} diff {r['max_diff']:.2e}")
        bad = [r for r in rows[-len(variants):] if "error" in r or r.get("max_diff", 0) > 0.02]
        for r in bad:
            print(f"  !! {r['variant']}: {r.get('error') or r['max_diff']}")
        del q, kv, meta, out, ref
        torch.cuda.empty_cache()
    # the plan with the least geometric-mean time against the backend's over every case
    by = {}
    for r in rows:
        if "ms" in r and r["max_diff"] <= 0.02:
            by.setdefault(r["variant"], {})[r["case"]] = r["ms"]
    base_by = by["backend"]
    scores = {v: float(torch.tensor([t[c] / base_by[c] for c in CASES]).log().mean().exp())
              for v, t in by.items() if len(t) == len(CASES)}
    ranked = sorted(scores.items(), key=lambda kv_: kv_[1])
    print("\ngeometric mean against the backend's plan:",
          ", ".join(f"{v} {s:.3f}" for v, s in ranked[:8]))
    json.dump({"rows": rows, "scores": scores, "device": torch.cuda.get_device_name()},
              open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
