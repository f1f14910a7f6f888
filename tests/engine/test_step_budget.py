"""The step's token budget: with chunked prefill, prompts longer than max_num_batched_tokens run
(and give the outputs of one-step prefills); without it, the budget must hold max_model_len."""
import pytest

from hifc import LLM, SamplingParams
from hifc.engine.limits import DEFAULT_BATCHED_TOKENS
from tests.runtime.helpers import output_tokens, random_prompts

TINY = "random:tiny-llama"
PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_prompts_longer_than_the_budget_are_chunked_with_the_same_outputs():
    prompts = random_prompts(4, (40, 300), seed=5)
    whole = LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128,
                enable_chunked_prefill=False, enable_prefix_caching=False)
    chunked = LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128,
                  max_num_batched_tokens=24, max_num_seqs=4, enable_prefix_caching=False)
    assert chunked.engine.limits.max_num_batched_tokens == 24
    assert output_tokens(chunked, prompts, PARAMS) == output_tokens(whole, prompts, PARAMS)
    # each step computes at most 24 tokens: the prompts alone take sum/24 steps
    n_prompt = sum(map(len, prompts))
    assert chunked.stats()["steps"] >= n_prompt // 24 > whole.stats()["steps"]


def test_default_budget_with_chunked_prefill():
    llm = LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128, max_num_seqs=9000)
    assert llm.engine.limits.max_num_batched_tokens == 9000  # a decode token for each
    llm = LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128)
    assert llm.engine.limits.max_num_batched_tokens == DEFAULT_BATCHED_TOKENS


def test_without_chunked_prefill_the_budget_must_hold_a_whole_prompt():
    with pytest.raises(ValueError, match="at least max_model_len.*without chunked prefill"):
        LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128, max_num_batched_tokens=64,
            max_num_seqs=8, enable_chunked_prefill=False)
