"""The flash prefix store behind the GPU prefix cache, end to end on the real SmolLM2 model
(float32, CPU): greedy outputs equal those without caching with the GPU cache alone, with the
store read back inside a run and after a restart, with corrupted and stale records; the cost
rule's choices are counted; nothing leaks; a clean close writes what the store lacks."""
import os

import pytest

from hifc import LLM, SamplingParams
from hifc.tiers.flash.scan import scan_headers

SYSTEM = ("You are the support assistant of a company that builds flash storage for AI servers. "
          "Answer briefly and precisely, name the component involved, and say when you are "
          "unsure. Customers run large language models whose key-value caches are swapped "
          "between GPU memory and NVMe drives, so keep the storage terms exact.")
QUESTIONS = ["What is write amplification?", "Why append-only writes?", "Is pSLC faster?"]
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
BASE = dict(device="cpu", dtype="float32", block_size=16, max_model_len=112)
# 7 blocks: the three chats' full blocks (4 shared, 1 each) and a running one do not fit
SMALL_POOL = dict(num_gpu_blocks=7, max_num_seqs=1)


def flash(path, **extra):
    return dict(kv_offload="flash", flash_path=str(path), flash_size_gib=0.05, **extra)


@pytest.fixture(scope="module")
def reference():
    """Prompts (three chats sharing a ~70-token system prompt, each asked twice) and their
    greedy outputs with prefix caching off."""
    llm = LLM("smollm2-135m", num_gpu_blocks=16, enable_prefix_caching=False, **BASE)
    tok = llm.get_tokenizer()
    chats = [tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": q}],
                                     add_generation_prompt=True) for q in QUESTIONS]
    return chats + chats, [o.token_ids for o in llm.generate(chats, PARAMS, use_tqdm=False)] * 2


def generate(llm, prompts):
    return [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


def assert_nothing_held(llm):
    """Every GPU block is free (or cached and free), every tier block and hold released."""
    stats = llm.stats()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert stats["tier_blocks_used"] == 0 and stats["swap_jobs_pending"] == 0
    tier = llm.engine.tier.stats()
    assert tier["prefix_store_held_blocks"] == 0 and tier["prefix_store_pinned_blocks"] == 0
    assert tier["num_free_blocks"] == tier["num_blocks"]


def stored_blocks(path, layout):
    """The tier blocks of the valid prefix records in the closed cache file at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return sorted(block for block, _ in scan_headers(fd, layout).records)
    finally:
        os.close(fd)


def damage(path, layout, corrupt: int, stale: int) -> None:
    """Flip payload bytes of record ``corrupt``; copy payload bytes of another record over
    those of record ``stale`` (a torn write: its header, older bytes)."""
    fd = os.open(path, os.O_RDWR)
    try:
        offset = layout.data_file_offset(2, 1, corrupt) + 64
        os.pwrite(fd, bytes(b ^ 0x5A for b in os.pread(fd, 8, offset)), offset)
        other = layout.data_file_offset(2, 1, corrupt) + 4096
        os.pwrite(fd, os.pread(fd, 256, other), layout.data_file_offset(2, 1, stale) + 64)
    finally:
        os.close(fd)


def test_store_parity_evictions_restart_and_damaged_records(reference, tmp_path):
    prompts, expected = reference
    path = tmp_path / "kv.hifc"
    always = flash(path, prefix_store_read="always")
    llm = LLM("smollm2-135m", **SMALL_POOL, **BASE, **always)
    assert generate(llm, prompts) == expected
    stats = llm.stats()
    # the chats evict each other's blocks: written before eviction, read back when asked again
    assert stats["prefix_store_bytes_written"] > 0 and stats["prefix_store_evicted_unstored"] == 0
    assert stats["prefix_store_hits"] > 0 and stats["prefix_store_recomputed"] == 0
    assert stats["prefix_store_read_tokens"] == stats["prefix_store_hits"]
    assert stats["prefix_store_bytes_read"] > 0 and stats["prefix_store_read_failures"] == 0
    assert_nothing_held(llm)
    llm.close()

    again = LLM("smollm2-135m", **SMALL_POOL, **BASE, **always)
    outputs = again.generate(prompts[:3], PARAMS, use_tqdm=False)
    assert [o.token_ids for o in outputs] == expected[:3]
    stats = again.stats()
    # each chat finds its whole prompt but the last token's block: the first one all in the
    # file (cold GPU), the others their own blocks there and the shared ones on the GPU
    full_blocks = [(len(o.prompt_token_ids) - 1) // 16 for o in outputs]
    assert [o.num_cached_tokens for o in outputs] == [16 * n for n in full_blocks]
    assert stats["prefix_store_read_tokens"] == stats["prefix_store_hits"] > 16 * full_blocks[0]
    assert (stats["prefix_cache_hits"] + stats["prefix_store_read_tokens"]
            == 16 * sum(full_blocks))
    assert_nothing_held(again)
    again.close()

    layout = again.engine.tier.layout
    blocks = stored_blocks(path, layout)
    damage(path, layout, corrupt=blocks[0], stale=blocks[1])
    damaged = LLM("smollm2-135m", **SMALL_POOL, **BASE, **always)
    assert generate(damaged, prompts[:3]) == expected[:3]
    stats = damaged.stats()
    assert stats["prefix_store_read_failures"] > 0
    assert stats["prefix_store_read_tokens"] < stats["prefix_store_hits"]
    assert damaged.engine.tier.stats()["prefix_store_records_dropped"] == 2
    assert_nothing_held(damaged)
    damaged.close()


TOKENS = [list(range(5, 5 + 70)), list(range(5, 5 + 48)) + list(range(300, 330))]
TINY = dict(device="cpu", block_size=16, num_gpu_blocks=32, max_num_seqs=4)
IDS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def tiny(path, model="random:tiny-llama", seed=0, dtype="float32", **extra):
    return LLM(model, seed=seed, dtype=dtype, **TINY,
               **flash(path, prefix_store_read="always", **extra))


def test_a_different_model_on_the_same_file_finds_nothing(tmp_path):
    path = tmp_path / "kv.hifc"
    llm = tiny(path)
    expected = [o.token_ids for o in llm.generate(TOKENS, IDS, use_tqdm=False)]
    llm.close()
    assert llm.stats()["prefix_store_flush_blocks"] >= 4
    # other weights and another architecture of the same KV geometry, then another dtype
    for model, seed, dtype in (("random:tiny-llama", 1, "float32"),
                               ("random:tiny-qwen2", 0, "float32"),
                               ("random:tiny-llama", 0, "bfloat16")):
        other = tiny(path, model, seed, dtype)
        other.generate(TOKENS, IDS, use_tqdm=False)
        stats = other.stats()
        assert stats["prefix_store_hits"] == 0 and stats["prefix_store_read_failures"] == 0
        assert other.engine.tier.stats()["reused_file"] is (dtype == "float32")
        other.close()
    same = tiny(path)  # the bfloat16 run reinitialised the file: nothing of the first is left
    assert [o.token_ids for o in same.generate(TOKENS, IDS, use_tqdm=False)] == expected
    assert same.stats()["prefix_store_hits"] == 0
    same.close()


def test_flush_is_bounded_by_its_option(tmp_path):
    path = tmp_path / "kv.hifc"
    llm = tiny(path, prefix_store_flush_seconds=0)
    llm.generate(TOKENS, IDS, use_tqdm=False)
    llm.close()
    assert llm.stats()["prefix_store_flush_blocks"] == 0
    again = tiny(path)
    again.generate(TOKENS, IDS, use_tqdm=False)
    assert again.stats()["prefix_store_hits"] == 0  # nothing was evicted, nothing flushed
    again.close()


def test_a_request_for_prompt_logprobs_computes_its_stored_prefix(tmp_path):
    """Prompt logprobs come from computing every prompt token: a prefix the store holds is not
    read for such a request (as the GPU prefix cache is not used), so the request gets them."""
    path = tmp_path / "kv.hifc"
    asks = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=1)
    ref = LLM("random:tiny-llama", dtype="float32", device="cpu", enable_prefix_caching=False)
    expected = ref.generate(TOKENS, asks, use_tqdm=False)
    warm = tiny(path)
    warm.generate(TOKENS, IDS, use_tqdm=False)
    warm.close()
    assert warm.stats()["prefix_store_flush_blocks"] >= 4
    llm = tiny(path)
    outputs = llm.generate(TOKENS, asks, use_tqdm=False)
    for got, want in zip(outputs, expected):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert got.prompt_logprobs is not None and got.num_cached_tokens == 0
        assert len(got.prompt_logprobs) == len(want.prompt_logprobs)
        for mine, theirs in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
            assert mine.keys() == theirs.keys()
            for token in theirs:
                assert mine[token].logprob == pytest.approx(theirs[token].logprob, abs=1e-4)
    assert llm.stats()["prefix_store_hits"] == 0
    assert_nothing_held(llm)
    llm.close()


@pytest.mark.parametrize("abort_at", range(6))
def test_aborts_at_any_step_release_everything(tmp_path, abort_at):
    """Two requests read their prefix from the store; each is aborted ``abort_at`` steps in
    (while loading, prefilling or decoding)."""
    path = tmp_path / "kv.hifc"
    warm = tiny(path)
    warm.generate(TOKENS, IDS, use_tqdm=False)
    warm.close()
    llm = tiny(path, max_num_batched_tokens=32)
    engine = llm.engine
    for i, tokens in enumerate(TOKENS):
        engine.add_request(f"r{i}", tokens, IDS)
    for step in range(abort_at + 1):
        if step == abort_at:
            engine.abort_request(["r0", "r1"])
        engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    assert llm.stats()["loading_prefix"] == 0
    assert_nothing_held(llm)
    llm.close()


@pytest.mark.parametrize("disk", ["fast", "slow"])
def test_the_cost_rule_reads_from_a_fast_disk_and_recomputes_past_a_slow_one(tmp_path, disk):
    path = tmp_path / "kv.hifc"
    prompts = [list(range(5, 75)), list(range(100, 170))]  # both decided in one step
    warm = tiny(path)
    expected = [o.token_ids for o in warm.generate(prompts, IDS, use_tqdm=False)]
    warm.close()
    llm = LLM("random:tiny-llama", dtype="float32", **TINY, **flash(path))  # auto
    engine = llm.engine
    block_bytes = engine.tier.geometry.block_bytes
    engine.preemption.prefill_speed.add(16_000, 1.0)  # tokens/s: a block costs 1 ms
    engine.swaps.read_bandwidth.add(block_bytes * (10_000 if disk == "fast" else 100), 1.0)
    assert [o.token_ids for o in llm.generate(prompts, IDS, use_tqdm=False)] == expected
    stats = llm.stats()
    assert stats["prefix_store_hits"] == 2 * 4 * 16
    if disk == "fast":
        assert stats["prefix_store_read_tokens"] == stats["prefix_store_hits"]
        assert stats["prefix_store_recomputed"] == 0
    else:
        assert stats["prefix_store_recomputed"] == stats["prefix_store_hits"]
        assert stats["prefix_store_read_tokens"] == stats["prefix_store_bytes_read"] == 0
    llm.close()


def test_swapped_out_blocks_the_store_holds_are_held_not_written(tmp_path, monkeypatch):
    """With every block stored as computed (``all``), a preempted sequence's swap-out writes
    only its newest, partial block; the others are read back by prefix reads at swap-in."""
    prompts = [list(range(5 + 7 * i, 45 + 7 * i)) for i in range(4)]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    ref = LLM("random:tiny-llama", dtype="float32", device="cpu", block_size=16,
              num_gpu_blocks=64, enable_prefix_caching=False)
    expected = [o.token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    llm = LLM("random:tiny-llama", dtype="float32", device="cpu", block_size=16,
              num_gpu_blocks=12, max_model_len=96,
              **flash(tmp_path / "kv.hifc", prefix_store="all", prefix_store_read="always"))
    engine, step = llm.engine, llm.engine.step

    def step_after_swap_io():
        # every swap job ends before the next step: which sequences are preempted, and when,
        # then does not hang on how fast the I/O threads run beside the test (a swap-out's
        # GPU blocks are freed when the tier has staged them)
        engine.swaps.drain()
        return step()

    monkeypatch.setattr(engine, "step", step_after_swap_io)
    assert [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == expected
    stats = llm.stats()
    assert stats["preemptions"] > 0 and stats["recomputed_sequences"] == 0
    assert stats["swap_out_blocks"] < stats["preemptions"] * 3  # a victim holds >= 3 blocks
    assert stats["swap_in_blocks"] == stats["swap_out_blocks"]
    assert stats["prefix_store_read_tokens"] > 0  # the held blocks, back by prefix reads
    assert_nothing_held(llm)
    llm.close()
