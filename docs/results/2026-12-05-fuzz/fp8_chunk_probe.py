"""Twenty random 63-token prompts of the tiny Llama prefilled in chunks of several sizes, with
float32 and fp8 KV caches: per chunk size, the largest prompt-logprob difference from one
whole-prompt step and how many prompts differ by more than 1e-4; then, for the first prompt
that does, the fp8 bytes written that differ between chunks of 16 and 8 tokens.

Usage (repo root): PYTHONPATH=$PWD python docs/results/2026-12-05-fuzz/fp8_chunk_probe.py
"""
import pathlib
import random
import sys
import tempfile

import torch

import hifc.layers.attention as attention
import tests.engine.test_engine_fuzz as fuzz
from hifc import LLMEngine
from tests.fixtures import make_tiny_hf_model

torch.set_num_threads(1)
model = str(make_tiny_hf_model(pathlib.Path(tempfile.mkdtemp()) / "tiny", "llama"))
PARAMS = fuzz.SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=0)
prompts = [[random.Random(i).randrange(3, 380) for _ in range(63)] for i in range(20)]


def prompt_logprobs(kv: str, chunk: int | None, prompt: list[int]) -> list[float]:
    engine = LLMEngine.from_options(
        model, device="cpu", dtype="float32", block_size=16, num_gpu_blocks=64, max_num_seqs=8,
        enable_prefix_caching=False, kv_cache_dtype=kv, max_num_batched_tokens=256,
        **({"long_prefill_token_threshold": chunk} if chunk else {}))
    out = fuzz.drive(engine, [("r", prompt, PARAMS)])[0]["r"]
    engine.close()
    return [next(iter(p.values())).logprob for p in out.prompt_logprobs[1:]]


first_flip = None
for kv in ("auto", "fp8"):
    wholes = [prompt_logprobs(kv, None, p) for p in prompts]
    for chunk in (16, 15, 8, 4):
        worst = []
        for i, (prompt, whole) in enumerate(zip(prompts, wholes)):
            got = prompt_logprobs(kv, chunk, prompt)
            worst.append(max(abs(a - b) for a, b in zip(got, whole)))
            if kv == "fp8" and chunk == 8 and worst[-1] > 1e-4 and first_flip is None:
                first_flip = i
        print(f"kv {kv:4} chunks of {chunk:2}: largest |logprob difference| {max(worst):.2e}, "
              f"prompts over 1e-4: {sum(w > 1e-4 for w in worst)} of {len(prompts)}")

written = []
original = attention.write_kv_cache


def recording(k, v, kv_cache, slot_mapping, kv_scale=None):
    if kv_cache.dtype == attention.FP8:
        written.append((slot_mapping.tolist(), attention.quantize_kv(k, kv_scale[0]),
                        attention.quantize_kv(v, kv_scale[1]), torch.stack([k, v], 1)))
    return original(k, v, kv_cache, slot_mapping, kv_scale)


for module in list(sys.modules.values()):
    if getattr(module, "write_kv_cache", None) is original:
        module.write_kv_cache = recording


def by_slot(chunk):
    written.clear()
    prompt_logprobs("fp8", chunk, prompts[first_flip])
    slots = {}
    for slot_ids, kq, vq, k in written:
        for j, slot in enumerate(slot_ids):
            slots.setdefault(slot, []).append((kq[j].view(torch.uint8), vq[j].view(torch.uint8),
                                               k[j]))
    return slots


print(f"prompt {first_flip}, chunks of 16 against 8:")
a, b = by_slot(16), by_slot(8)
for slot in sorted(a):
    for layer, ((ka, va, fa), (kb, vb, fb)) in enumerate(zip(a[slot], b[slot])):
        nk, nv = int((ka != kb).sum()), int((va != vb).sum())
        if nk or nv:
            print(f"slot {slot} layer {layer}: {nk} K and {nv} V fp8 bytes differ; the float32 "
                  f"keys and values differ by at most {float((fa - fb).abs().max()):.1e}")
