"""Padded decode steps (the computation CUDA graphs replay) run eagerly on CPU: same outputs as
the unpadded path, with batches crossing the captured sizes, admissions, swaps, recompute."""
import pytest

from hifc import LLM, SamplingParams
from tests.runtime.helpers import (SkipPaddingReference, assert_same_outputs_and_prompt_logprobs,
                                   output_tokens, random_prompts, staggered)

MODEL = "random:tiny-llama"
SIZES = [1, 2, 4]  # 5 or more sequences decode unpadded (eagerly)


def make_llm(padded: bool, chunk_tokens: int = 0, **options):
    llm = LLM(MODEL, device="cpu", dtype="float32", block_size=16, **options)
    if padded:
        runner = llm.engine.runner
        runner.backend = SkipPaddingReference()
        runner.use_padded_decode(llm.engine.limits.max_model_len, SIZES, capture=False,
                                 chunk_tokens=chunk_tokens)
    return llm


@pytest.mark.parametrize("max_num_seqs", [8, 3])
def test_padded_decode_gives_the_unpadded_greedy_outputs(max_num_seqs):
    prompts = random_prompts(6, (1, 40), seed=max_num_seqs)
    params = staggered(6, max_tokens=6)
    ref = output_tokens(make_llm(False, num_gpu_blocks=64, max_num_seqs=max_num_seqs), prompts,
                        params)
    llm = make_llm(True, num_gpu_blocks=64, max_num_seqs=max_num_seqs)
    assert output_tokens(llm, prompts, params) == ref
    stats = llm.stats()
    assert 0 < llm.engine.runner.num_padded_decode_steps < stats["steps"]
    assert stats["graph_decode_steps"] == 0  # padded, never replayed: no graphs on CPU
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]


def test_seeded_sampling_is_unchanged_by_padding():
    prompts = random_prompts(5, (3, 30), seed=11)
    params = staggered(5, max_tokens=6, temperature=0.9, seed=100)
    ref = output_tokens(make_llm(False, num_gpu_blocks=64), prompts, params)
    assert output_tokens(make_llm(True, num_gpu_blocks=64), prompts, params) == ref


@pytest.mark.parametrize("tier", [None, "dram"])
def test_padded_decode_keeps_outputs_under_preemption(tier, tmp_path):
    prompts = random_prompts(5, (8, 12), seed=3)
    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)] * 5
    ref = output_tokens(make_llm(False, num_gpu_blocks=64), prompts, params)
    options = dict(kv_offload="dram", swap_space=0.01) if tier else {}
    llm = make_llm(True, num_gpu_blocks=7, **options)  # 5 x 2 blocks do not fit in 7
    assert output_tokens(llm, prompts, params) == ref
    stats = llm.stats()
    assert stats["preemptions"] > 0 and llm.engine.runner.num_padded_decode_steps > 0
    if tier:
        assert stats["swap_in_blocks"] == stats["swap_out_blocks"] > 0
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    llm.close()


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_cpu_engine_runs_eagerly_either_way(enforce_eager):
    llm = LLM(MODEL, device="cpu", block_size=16, num_gpu_blocks=16, enforce_eager=enforce_eager)
    assert llm.engine.runner.decode_graphs is None
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].token_ids) == 4 and llm.stats()["graph_decode_steps"] == 0


@pytest.mark.parametrize("threshold", [16, 24])
def test_decodes_beside_a_prompt_chunk_run_padded_with_the_unpadded_outputs(threshold):
    # chunks of up to 16 / 24 tokens (the chunk region: 16) beside 1-4 decodes: steps whose
    # chunk fits run through the chunk path, the others eagerly; outputs unchanged
    prompts = random_prompts(6, (20, 90), seed=threshold)
    params = staggered(6, max_tokens=8)
    options = dict(num_gpu_blocks=96, max_num_seqs=4, long_prefill_token_threshold=threshold)
    ref = output_tokens(make_llm(False, **options), prompts, params)
    llm = make_llm(True, chunk_tokens=16, **options)
    assert output_tokens(llm, prompts, params) == ref
    graphs = llm.engine.runner.decode_graphs
    assert graphs.num_chunk_steps > 0 and llm.engine.runner.num_padded_decode_steps > 0
    assert llm.stats()["graph_chunk_steps"] == 0  # run padded, never replayed: no graphs on CPU
    assert llm.stats()["gpu_blocks_free"] == llm.stats()["gpu_blocks_total"]


@pytest.mark.parametrize("threshold, chunk_tokens, lengths", [(8, 8, (40, 60)), (1, 0, (6, 12))])
def test_steps_that_ask_for_prompt_logprobs_run_eagerly(threshold, chunk_tokens, lengths):
    # prompt chunks of 8 tokens beside decodes (the chunk path's shape), or of one token (the
    # decode path's): the prompt logprobs need the hidden states the padded path does not keep
    prompts = random_prompts(3, lengths, seed=4 + threshold)
    params = [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)] * 2 + [
        SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2, ignore_eos=True)]
    options = dict(num_gpu_blocks=64, long_prefill_token_threshold=threshold)
    ref = make_llm(False, **options).generate(prompts, params, use_tqdm=False)
    llm = make_llm(True, chunk_tokens=chunk_tokens, **options)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert_same_outputs_and_prompt_logprobs(got, ref, prompts, 1e-4)
    assert llm.engine.runner.num_padded_decode_steps > 0
