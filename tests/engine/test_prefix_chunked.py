"""Prefix caching and chunked prefill on the real SmolLM2 model (float32, CPU): greedy outputs
equal those with both off, with swapping forced to flash and to DRAM, and no block leaks."""
import pytest

from hifc import LLM, SamplingParams

SYSTEM = ("You are the support assistant of a company that builds flash storage for AI servers. "
          "Answer briefly and precisely, name the component involved, and say when you are "
          "unsure. Customers run large language models whose key-value caches are swapped "
          "between GPU memory and NVMe drives.")
QUESTIONS = ["What is write amplification?", "Why append-only writes?",
             "How big is a KV block?", "What is GPUDirect Storage?"]
PARAMS = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
BASE = dict(device="cpu", dtype="float32", block_size=16, max_model_len=128)


def chat_prompts(tokenizer) -> list[str]:
    """Four chats sharing a long system prompt (~60 tokens), then the first one again."""
    chats = [tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": q}],
                                           add_generation_prompt=True) for q in QUESTIONS]
    return chats + chats[:1]


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs with prefix caching and chunked prefill off, no memory pressure."""
    llm = LLM("smollm2-135m", num_gpu_blocks=64, enable_prefix_caching=False,
              enable_chunked_prefill=False, **BASE)
    prompts = chat_prompts(llm.get_tokenizer())
    outputs = [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
    stats = llm.stats()
    assert stats["prefix_cache_queries"] == stats["gpu_blocks_cached"] == 0
    return prompts, outputs


def assert_no_blocks_held(llm):
    """Every GPU block is free, or cached and free; every tier block is free."""
    stats = llm.stats()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert stats["gpu_blocks_cached"] <= stats["gpu_blocks_total"]
    kv = llm.engine.kv_manager
    assert all(kv.pool.ref_count(b) == 0 for b in range(kv.num_total_blocks))
    assert stats["tier_blocks_used"] == 0 and stats["swap_jobs_pending"] == 0


def test_prefix_caching_keeps_greedy_outputs(reference, smollm2):
    prompts, expected = reference
    llm = smollm2[0]  # the session's SmolLM2 engine: prefix caching on by default
    before = llm.stats()
    first = llm.generate(prompts, PARAMS, use_tqdm=False)
    assert [o.token_ids for o in first] == expected
    middle = llm.stats()
    # the shared system prompt and the repeated chat are found while the batch is admitted
    assert middle["prefix_cache_hits"] - before["prefix_cache_hits"] >= 3 * 48
    again = llm.generate(prompts, PARAMS, use_tqdm=False)  # every prompt cached but its tail
    assert [o.token_ids for o in again] == expected
    n_prompt = [len(o.prompt_token_ids) for o in again]
    assert [o.num_cached_tokens for o in again] == [(n - 1) // 16 * 16 for n in n_prompt]
    after = llm.stats()
    assert after["prefix_cache_queries"] - middle["prefix_cache_queries"] == sum(n_prompt)
    assert after["gpu_blocks_cached"] > 0
    assert_no_blocks_held(llm)


@pytest.mark.parametrize("kind,prefix_caching", [("flash", True), ("dram", False)])
def test_chunked_prefill_with_forced_swapping_keeps_greedy_outputs(reference, kind,
                                                                   prefix_caching, tmp_path):
    prompts, expected = reference
    tier = (dict(kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.05)
            if kind == "flash" else dict(kv_offload="dram", swap_space=0.05))
    # prompts of ~75 tokens in steps of 32; 5 sequences of 6 blocks do not fit in 12 blocks
    llm = LLM("smollm2-135m", num_gpu_blocks=12, max_num_batched_tokens=32, max_num_seqs=8,
              enable_prefix_caching=prefix_caching, **BASE, **tier)
    outputs = llm.generate(prompts, PARAMS, use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected
    stats = llm.stats()
    assert stats["preemptions"] > 0 and stats["swap_out_blocks"] > 0
    assert stats["swap_in_blocks"] + stats["recomputed_sequences"] > 0
    # every prompt is longer than a step's budget: each was prefilled over several steps
    assert min(len(o.prompt_token_ids) for o in outputs) > llm.engine.limits.max_num_batched_tokens
    assert (stats["prefix_cache_hits"] > 0) is prefix_caching
    assert_no_blocks_held(llm)
    llm.close()
