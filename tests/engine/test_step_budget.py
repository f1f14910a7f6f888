"""The step's token budget: with chunked prefill, prompts longer than max_num_batched_tokens run
(and give the outputs of one-step prefills); without it, the budget must hold max_model_len."""
import types

import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.config import EngineConfig
from hifc.core.scheduler import longest_chunk_within
from hifc.engine.limits import DEFAULT_BATCHED_TOKENS, chunked_default
from hifc.entrypoints.cli import build_parser
from hifc.parallel import data_parallel
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


def test_long_prefill_token_threshold_gives_the_same_outputs_in_more_steps():
    prompts = random_prompts(4, (40, 300), seed=6)
    common = dict(device="cpu", block_size=16, num_gpu_blocks=128, enable_prefix_caching=False)
    plain = LLM(TINY, **common)
    capped = LLM(TINY, long_prefill_token_threshold=16, **common)
    assert output_tokens(capped, prompts, PARAMS) == output_tokens(plain, prompts, PARAMS)
    longest = max(map(len, prompts))
    assert capped.stats()["steps"] >= -(-longest // 16) + PARAMS.max_tokens - 1
    assert capped.stats()["steps"] > plain.stats()["steps"]


def test_prefill_attention_budget_gives_the_same_outputs_with_shrinking_chunks():
    prompts = random_prompts(4, (40, 300), seed=7)
    common = dict(device="cpu", block_size=16, num_gpu_blocks=128, enable_prefix_caching=False,
                  max_model_len=512)
    plain = LLM(TINY, **common)
    budgeted = LLM(TINY, prefill_attention_budget=2048, **common)
    assert output_tokens(budgeted, prompts, PARAMS) == output_tokens(plain, prompts, PARAMS)
    # the longest prompt alone needs a step per chunk that fits 2048 pairs
    context, steps = 0, 0
    while context < max(map(len, prompts)):
        context += longest_chunk_within(context, 2048)
        steps += 1
    assert budgeted.stats()["steps"] >= steps + PARAMS.max_tokens - 1 > plain.stats()["steps"]


@pytest.mark.parametrize("name", ["long_prefill_token_threshold", "prefill_attention_budget"])
def test_prefill_chunk_limits_are_checked(name):
    with pytest.raises(ValueError, match=f"{name} must be a non-negative"):
        LLM(TINY, device="cpu", num_gpu_blocks=64, **{name: -1})
    with pytest.raises(ValueError, match=f"{name} needs enable_chunked_prefill"):
        LLM(TINY, device="cpu", num_gpu_blocks=64, enable_chunked_prefill=False,
            **{name: 1024})


def test_prefill_attention_budget_holds_a_token_at_max_model_len():
    with pytest.raises(ValueError, match=r"prefill_attention_budget \(511\) must be 0 or at least "
                                         r"max_model_len \(512\)"):
        LLM(TINY, device="cpu", num_gpu_blocks=64, max_model_len=512,
            prefill_attention_budget=511)


def test_default_budget_with_chunked_prefill():
    llm = LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128, max_num_seqs=9000)
    assert llm.engine.limits.max_num_batched_tokens == 9000  # a decode token for each
    llm = LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128)
    assert llm.engine.limits.max_num_batched_tokens == DEFAULT_BATCHED_TOKENS


@pytest.mark.parametrize("usage, name, gib, budget", [
    ("llm", "NVIDIA H100 80GB HBM3", 79.2, 16384), ("llm", "NVIDIA H200", 139.8, 16384),
    ("llm", "NVIDIA A100-SXM4-80GB", 79.2, 8192), ("llm", "NVIDIA L40S", 44.5, 8192),
    ("server", "NVIDIA H100 80GB HBM3", 79.2, 8192)])
def test_the_default_budget_is_vllms_for_the_usage_context_and_gpu(monkeypatch, usage, name,
                                                                      gib, budget):
    props = types.SimpleNamespace(name=name, total_memory=int(gib * (1 << 30)))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    assert chunked_default(usage, torch.device("cuda", 0)) == budget
    assert chunked_default(usage, torch.device("cpu")) == DEFAULT_BATCHED_TOKENS


class _Built(Exception):
    """Raised in place of building the server's engine."""


def test_serve_builds_its_engine_in_the_server_usage_context(monkeypatch):
    built = []

    def build(config, engine_process):
        built.append(config)
        raise _Built

    monkeypatch.setattr(data_parallel, "build_engine", build)
    args = build_parser().parse_args(["serve", TINY, "--device", "cpu"])
    with pytest.raises(_Built):
        args.func(args)
    assert built[0].usage_context == "server"
    assert EngineConfig().usage_context == "llm"
    with pytest.raises(ValueError, match="usage_context must be one of llm, server"):
        EngineConfig(usage_context="batch")
    with pytest.raises(SystemExit):  # not a flag: the entry point decides it
        build_parser().parse_args(["serve", TINY, "--usage-context", "llm"])


def test_without_chunked_prefill_the_budget_must_hold_a_whole_prompt():
    with pytest.raises(ValueError, match="at least max_model_len.*without chunked prefill"):
        LLM(TINY, device="cpu", block_size=16, num_gpu_blocks=128, max_num_batched_tokens=64,
            max_num_seqs=8, enable_chunked_prefill=False)
