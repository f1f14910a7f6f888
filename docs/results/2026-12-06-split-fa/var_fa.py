"""var.py VARIANT cli-args: VARIANT 'base' (the code as is) or 'fa' (every step's prompt chunks,
any number of them, through one FlashAttention-2 varlen call, cached keys gathered)."""
import sys
import torch
from hifc.layers import triton_attention as TA
from hifc.layers import dense_attention as DA

variant = sys.argv[1]
if variant == "fa":
    def dense_chunks_after(meta, dtype, token_bytes):
        if dtype not in (torch.bfloat16, torch.float16):
            return None
        spans = DA._spans(meta)
        decodes = next((i for i, s, e, _ in spans if e - s != 1), len(spans))
        if decodes == len(spans):
            return None
        longest = max(c for *_, c in spans[decodes:])
        return decodes if longest * token_bytes <= DA.MAX_GATHER_BYTES else None

    _cu = {}

    def fa_prefill(q, k, v, kv_cache, meta, scale, out=None):
        spans = DA._spans(meta)
        if any(c for *_, c in spans):
            ks, vs, cu = [], [], [0]
            for i, s, e, c in spans:
                if c:
                    kc, vc = DA._cached_keys(kv_cache, meta.block_tables[i], c, meta.block_size)
                    ks.append(kc[0].transpose(0, 1)); vs.append(vc[0].transpose(0, 1))
                ks.append(k[s:e]); vs.append(v[s:e])
                cu.append(cu[-1] + c + e - s)
            kk, vv = torch.cat(ks), torch.cat(vs)
            key = tuple(cu)
            if key not in _cu:
                _cu.clear(); _cu[key] = torch.tensor(cu, dtype=torch.int32, device=q.device)
            cu_k = _cu[key]
        else:
            kk, vv, cu_k = k, v, meta.query_start_loc
        max_k = max(c + e - s for _, s, e, c in spans)
        o = torch.ops.aten._flash_attention_forward(
            q, kk, vv, meta.query_start_loc, cu_k, meta.max_query_len, max_k, 0.0, True, False,
            scale=scale)[0]
        if out is None:
            return o
        out.copy_(o)
        return out

    TA.dense_chunks_after = dense_chunks_after
    TA.dense_prefill_attention = fa_prefill
    TA.FusedShapes.take = lambda self, shapes, flops: True
print("variant", variant, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
