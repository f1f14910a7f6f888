"""Triton attention as CUDA graphs run it: a launch plan fixed per batch size from
max_model_len, actual lengths read from device memory, padding rows. Runs on a CUDA GPU, or on
the CPU through Triton's interpreter with TRITON_INTERPRET=1 (fp32 only there)."""
import math
import os
import random

import numpy as np
import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.layers.attention import AttentionMetadata, reference_paged_attention, write_kv_cache
from hifc.runtime import inputs
from hifc.runtime.inputs import DecodeInputLayout, decode_input_views, fill_decode_inputs
from tests.runtime.helpers import decode_work, random_prompts

try:
    from hifc.layers.triton_attention import (TritonAttentionBackend, paged_attention,
                                              plan_launch)
    from hifc.layers.triton_kv_write import triton_write_kv_cache
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

if torch.cuda.is_available():
    DEVICE = "cuda"
elif os.environ.get("TRITON_INTERPRET") == "1":
    DEVICE = "cpu"
else:
    DEVICE = None

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE is None or not HAS_TRITON,
                                 reason="needs CUDA and triton (or TRITON_INTERPRET=1)")]
H200_SMS = 132
DTYPES = [torch.float32] if DEVICE == "cpu" else [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-3}


def padded_step(seq_lens, batch, max_model_len, block_size, num_q_heads, num_kv_heads,
                head_dim, dtype, seed):
    """A decode step of len(seq_lens) sequences padded to `batch` rows, as a graph sees it
    (metadata from the packed buffer, max_seq_len = max_model_len), plus the unpadded one."""
    gen = torch.Generator().manual_seed(seed)
    work = decode_work(seq_lens, block_size, seed=seed)
    num_blocks = sum(len(w.block_table) for w in work) + 3
    layout = DecodeInputLayout(batch, -(-max_model_len // block_size))
    host = np.zeros(layout.numel, dtype=np.int32)
    fill_decode_inputs(work, batch, block_size, layout, host)
    x = decode_input_views(torch.from_numpy(host).to(DEVICE), layout, batch)
    graph_meta = AttentionMetadata(
        slot_mapping=x.slot_mapping.long(), query_start_loc=x.query_start_loc,
        seq_lens=x.seq_lens, block_tables=x.block_tables,
        query_start_loc_cpu=list(range(batch + 1)), seq_lens_cpu=[1] * batch,  # stale
        max_query_len=1, max_seq_len=max_model_len, block_size=block_size)
    real_meta = inputs.build_attention_metadata(work, block_size, DEVICE)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)

    kv_cache = rand(2, num_blocks, block_size, num_kv_heads, head_dim)
    q = rand(batch, num_q_heads, head_dim) * 2
    k = rand(batch, num_kv_heads, head_dim)
    v = rand(batch, num_kv_heads, head_dim)
    return q, k, v, kv_cache, graph_meta, real_meta


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seq_lens,batch", [
    ([1], 1),                       # one key: every segment but the first is empty
    ([700], 1),
    ([5, 130, 2047], 4),            # one padding row
    ([1, 64, 65, 300, 999], 8),     # three padding rows
])
@pytest.mark.parametrize("split", [True, False])
def test_plan_from_max_model_len_reads_actual_lengths(seq_lens, batch, dtype, split):
    max_model_len, block_size = 2048, 16
    q, k, v, kv_cache, graph_meta, real_meta = padded_step(
        seq_lens, batch, max_model_len, block_size, 4, 2, 32, dtype, seed=len(seq_lens))
    n = len(seq_lens)
    plan = plan_launch(1, max_model_len, batch, 4, 2, 32, q.element_size(), H200_SMS,
                       split_kv=split)
    assert (plan.num_segments > 1) == split
    check_padded_step(q, k, v, kv_cache, graph_meta, real_meta, plan, n, dtype)


def check_padded_step(q, k, v, kv_cache, graph_meta, real_meta, plan, n, dtype):
    """The first n rows are real: padding rows write no K/V and read initialised keys only,
    real rows match the reference."""
    scale = 1 / math.sqrt(q.shape[-1])
    ref_cache = kv_cache.clone()
    write_kv_cache(k[:n], v[:n], ref_cache, real_meta.slot_mapping)
    ref = reference_paged_attention(q[:n].float(), ref_cache.float(), real_meta, scale)
    triton_write_kv_cache(k, v, kv_cache, graph_meta.slot_mapping)
    assert torch.equal(kv_cache, ref_cache), "padding rows must not write the cache"
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kv_cache, graph_meta, scale, plan, out)
    assert torch.isfinite(out).all(), "padding rows must read initialised keys only"
    err = ((out[:n].float() - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("split", [True, False])
def test_graph_decode_with_window_and_softcap(split):
    # A padded decode step under a fixed plan, Gemma 2 style: window and soft-capped scores.
    seq_lens, batch, max_model_len, window, softcap = [5, 130, 999], 4, 1024, 100, 5.0
    q, k, v, kv_cache, graph_meta, real_meta = padded_step(
        seq_lens, batch, max_model_len, 16, 4, 2, 32, torch.float32, seed=7)
    plan = plan_launch(1, window + 1, batch, 4, 2, 32, 4, H200_SMS, split_kv=split)
    ref_cache = kv_cache.clone()
    write_kv_cache(k[:3], v[:3], ref_cache, real_meta.slot_mapping)
    ref = reference_paged_attention(q[:3], ref_cache, real_meta, 1 / math.sqrt(32), window,
                                    softcap)
    triton_write_kv_cache(k, v, kv_cache, graph_meta.slot_mapping)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kv_cache, graph_meta, 1 / math.sqrt(32), plan, out, window, softcap)
    assert torch.isfinite(out).all(), "padding rows must read initialised keys only"
    err = ((out[:3] - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[torch.float32], f"relative error {err:.2e}"


@pytest.mark.parametrize("split", [True, False])
def test_graph_decode_with_fp8_cache(split):
    """A padded decode step over a float8 cache with per-head scales: padding rows write nothing
    and read initialised keys; real rows match the reference reading the same cache."""
    seq_lens, batch, max_model_len = [5, 130, 999], 4, 1024
    q, k, v, kv_cache, graph_meta, real_meta = padded_step(
        seq_lens, batch, max_model_len, 16, 4, 2, 32, torch.float32, seed=8)
    kv_scale = torch.tensor([[0.02, 0.05], [0.01, 0.03]], device=DEVICE)  # [K/V, Hkv]
    kv_cache = (kv_cache / kv_scale[:, None, None, :, None]).to(torch.float8_e4m3fn)
    plan = plan_launch(1, max_model_len, batch, 4, 2, 32, 4, H200_SMS, split_kv=split)
    before = kv_cache.clone()
    triton_write_kv_cache(k, v, kv_cache, graph_meta.slot_mapping, kv_scale)
    by_slot = [c.view(torch.uint8).reshape(2, -1, 2 * 32) for c in (kv_cache, before)]
    written = (by_slot[0] != by_slot[1]).any(-1).any(0)  # [slots]
    slots = set(torch.nonzero(written).flatten().tolist())
    assert slots and slots <= set(real_meta.slot_mapping.tolist()), "padding rows must not write"
    out = torch.full_like(q, float("nan"))
    paged_attention(q, kv_cache, graph_meta, 1 / math.sqrt(32), plan, out, kv_scale=kv_scale)
    assert torch.isfinite(out).all(), "padding rows must read initialised keys only"
    ref = reference_paged_attention(q[:3], kv_cache, real_meta, 1 / math.sqrt(32),
                                    kv_scale=kv_scale)
    err = ((out[:3] - ref).norm() / ref.norm()).item()
    assert err < TOLERANCE[torch.float32], f"relative error {err:.2e}"


def test_graph_plans_depend_only_on_the_batch_size_and_cap():
    """Even splits for small batches (and for larger ones with short contexts), balanced
    segments for larger ones over long contexts and for the largest, fixed by the graph's
    context cap: the plans graphs capture."""
    sizes = (1, 2, 4, 8, 16, 128)
    plans = {b: plan_launch(1, 32768, b, 32, 8, 128, 2, H200_SMS) for b in sizes}
    assert [plans[b].num_segments for b in sizes] == [32, 32, 16, 8, 8, 8]
    assert [plans[b].segment_tiles * plans[b].tile for b in sizes] == [64] * 4 + [4096] * 2
    short = {b: plan_launch(1, 4096, b, 32, 8, 128, 2, H200_SMS) for b in sizes}
    assert [short[b].num_segments for b in sizes] == [32, 32, 16, 8, 4, 2]  # 128: balanced
    assert TritonAttentionBackend().graph_context_caps(32768) == [4096, 32768]
    assert TritonAttentionBackend().graph_context_caps(4096) == [4096]
    assert TritonAttentionBackend(split_kv=False).graph_context_caps(32768) == [32768]


class _H200Sized(TritonAttentionBackend):
    def num_sms(self, device):
        return H200_SMS  # an H100's too


def test_decode_graph_caps_stretch_the_short_cap_while_the_plan_is_the_same():
    """8B shapes (32 query heads, 8 KV heads, bf16), 132 SMs: a decode batch's short cap is
    the longest power-of-two multiple of 4,096 keys below max_model_len planned as 4,096 keys
    are (batch 32: an even split in two, up to 8,192 keys, where a 4,100-key step under a
    131,072-key cap took one balanced segment per KV head); where max_model_len plans as the
    short cap (batches of at most one program per two SMs split evenly under any cap), it
    alone."""
    kv_cache = torch.zeros(2, 1, 16, 8, 128, dtype=torch.bfloat16)
    sizes = [1, 2, 4, 8, 16, 24, 32, 40, 64, 128]
    backend = _H200Sized()
    caps = backend.plan_decodes_as_graphs(sizes, 131072, 32, kv_cache, torch.bfloat16)
    assert caps == {1: [131072], 2: [131072], 4: [131072], 8: [131072],
                    16: [16384, 131072], 24: [8192, 131072],
                    32: [8192, 131072], 40: [8192, 131072], 64: [8192, 131072],
                    128: [8192, 131072]}
    for batch, (*short, long) in caps.items():
        short = short[0] if short else long
        plan = plan_launch(1, short, batch, 32, 8, 128, 2, H200_SMS)
        assert plan == plan_launch(1, 4096, batch, 32, 8, 128, 2, H200_SMS)
        assert (plan == plan_launch(1, long, batch, 32, 8, 128, 2, H200_SMS)) == (short == long)
        assert 2 * short >= long or plan != plan_launch(1, 2 * short, batch, 32, 8, 128, 2,
                                                         H200_SMS)
    # the bench's 8,193-key cap: a 4,100-key step of batch 32 replays the 8,192-key graph
    assert backend.plan_decodes_as_graphs([32], 8193, 32, kv_cache, torch.bfloat16) == {
        32: [8192, 8193]}
    even = plan_launch(1, 8192, 32, 32, 8, 128, 2, H200_SMS)
    assert even.num_segments == 2 and even.segment_tiles == 1
    assert backend.plan_decodes_as_graphs([2], 8192, 32, kv_cache, torch.bfloat16) == {
        2: [8192]}
    assert backend.plan_decodes_as_graphs([32], 4096, 32, kv_cache, torch.bfloat16) == {
        32: [4096]}
    assert TritonAttentionBackend(split_kv=True).plan_decodes_as_graphs(
        [32], 131072, 32, kv_cache, torch.bfloat16) == {32: [131072]}


@pytest.mark.skipif(DEVICE == "cpu", reason="40 sequences of up to 9k keys: GPU only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_balanced_segments_under_a_graph_plan(dtype):
    """A padded decode step of 37 sequences of 1 to 9,000 keys under the plan of a 32k cap at
    batch 40 (balanced segments)."""
    rng = random.Random(3)
    seq_lens = [1, 4096, 4097, 9000] + [rng.randrange(1, 9000) for _ in range(33)]
    batch, max_model_len = 40, 32768
    q, k, v, kv_cache, graph_meta, real_meta = padded_step(
        seq_lens, batch, max_model_len, 16, 8, 2, 128, dtype, seed=4)
    plan = plan_launch(1, max_model_len, batch, 8, 2, 128, q.element_size(), H200_SMS)
    assert plan.num_segments > 1 and plan.segment_tiles > 1
    check_padded_step(q, k, v, kv_cache, graph_meta, real_meta, plan, len(seq_lens), dtype)


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    "random:tiny-llama",
    # sliding windows (48, 40) crossed by the longer prompts, soft-capping: on the GPU only (the
    # interpreter takes half a minute per model; the kernel cases above cover both there)
    *(pytest.param(m, marks=pytest.mark.skipif(DEVICE == "cpu", reason="GPU only"))
      for m in ("random:tiny-mistral", "random:tiny-gemma2"))])
def test_padded_decode_through_triton_matches_the_torch_engine(model):
    """The engine's padded decode path with the Triton backend (no capture) against the torch
    reference engine: greedy outputs identical."""
    check_padded_engine(model, TritonAttentionBackend(split_kv=True))


@pytest.mark.slow
def test_padded_chunks_through_triton_match_the_torch_engine():
    """Decodes beside 8-token prompt chunks run padded (the chunk graphs' computation, decodes
    attended apart from the chunk) with the Triton backend: greedy outputs identical."""
    runner = check_padded_engine("random:tiny-llama", TritonAttentionBackend(), chunk_tokens=8)
    assert runner.decode_graphs.num_chunk_steps > 0


def check_padded_engine(model, backend, chunk_tokens=0):
    prompts = random_prompts(6, (1, 70), seed=5)
    params = [SamplingParams(max_tokens=5 + 2 * i, temperature=0.0, ignore_eos=True)
              for i in range(6)]
    common = dict(device=DEVICE, dtype="float32", block_size=16, num_gpu_blocks=64,
                  max_model_len=1024, enforce_eager=True, long_prefill_token_threshold=chunk_tokens)
    ref = LLM(model, attention_backend="torch", **common)
    expected = [o.token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    llm = LLM(model, attention_backend="torch", **common)
    runner = llm.engine.runner
    runner.backend = backend
    runner.use_padded_decode(llm.engine.limits.max_model_len, [1, 2, 4, 8], capture=False,
                             chunk_tokens=chunk_tokens)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == expected
    assert runner.num_padded_decode_steps > 0
    return runner
