"""Asynchronous scheduling (``async_scheduling``): step N+1 is scheduled and launched before step
N's tokens are applied. The outputs are those of the engine without it, under chunked prefill,
prefix caching, preemption (recompute, DRAM, flash), the padded decode path, stops in the middle
of a batch, aborts and sampling features; steps after bad-words or structured sampling wait."""
from __future__ import annotations

import argparse
import random

import pytest

from hifc import LLM, LLMEngine, SamplingParams
from hifc.config import EngineConfig, add_engine_args, engine_config_from_args
from hifc.parallel.config import ParallelConfig
from hifc.sampling_params import StructuredOutputsParams
from tests.fixtures import make_tiny_hf_model
from tests.runtime.helpers import SkipPaddingReference

MODEL = "random:tiny-llama"


def make_llm(async_scheduling: bool, model=MODEL, **options) -> LLM:
    options.setdefault("block_size", 16)
    options.setdefault("max_num_seqs", 8)
    return LLM(model, device="cpu", dtype="float32", async_scheduling=async_scheduling,
               **options)


def prompts_with_shared_prefix(n: int, seed: int = 0) -> list[list[int]]:
    """n prompts of 5..60 tokens, half of them after a common 20-token prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 500) for _ in range(20)]
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randint(5, 40))] for _ in range(n)]
    return [prefix + p if i % 2 else p for i, p in enumerate(prompts)]


def completions(outputs) -> list[list[tuple]]:
    """What a caller sees of each request: per completion its tokens, text, finish and stop
    reasons, and its logprobs (token -> (logprob, rank) per position)."""
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason,
              None if c.logprobs is None else
              [{t: (lp.logprob, lp.rank) for t, lp in pos.items()} for pos in c.logprobs])
             for c in o.outputs] for o in outputs]


def assert_same(got, expected) -> None:
    """The same completions; logprobs equal up to float rounding (a different batch around a
    sequence may change their last bits)."""
    assert [[c[:4] for c in o] for o in got] == [[c[:4] for c in o] for o in expected]
    for o_got, o_expected in zip(got, expected):
        for c_got, c_expected in zip(o_got, o_expected):
            if c_expected[4] is None:
                assert c_got[4] is None
                continue
            for pos_got, pos_expected in zip(c_got[4], c_expected[4]):
                assert pos_got.keys() == pos_expected.keys()
                for token, (logprob, rank) in pos_expected.items():
                    assert pos_got[token] == (pytest.approx(logprob, abs=1e-4), rank)


def both(prompts, params, own_flash_files: bool = False, **options) -> tuple[list, list, dict]:
    """The outputs without and with asynchronous scheduling, and the latter's stats; with
    own_flash_files each run has a flash file of its own (``flash_path`` plus a suffix), else
    the second run opens the first's and reads its prefix store."""
    results, stats = [], {}
    for async_scheduling in (False, True):
        run_options = dict(options)
        if own_flash_files:
            run_options["flash_path"] = f"{options['flash_path']}.{int(async_scheduling)}"
        llm = make_llm(async_scheduling, **run_options)
        results.append(completions(llm.generate(prompts, params, use_tqdm=False)))
        stats = llm.stats()
        assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
        assert (stats["overlapped_steps"] > 0) == async_scheduling
        llm.close()
    return results[0], results[1], stats


def stops_midway(prompts, **options) -> list[SamplingParams]:
    """Greedy params where request i stops at a stop token it generates after 2 + i tokens (a
    stop in the middle of a batch), the others ending by length at staggered limits."""
    llm = make_llm(False, **options)
    free = llm.generate(prompts, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
                        use_tqdm=False)
    params = []
    for i, out in enumerate(free):
        stop = out.token_ids[2 + i % 5]
        params.append(SamplingParams(max_tokens=12 + 3 * i, temperature=0, ignore_eos=True,
                                     stop_token_ids=[stop] if i % 3 else []))
    return params


def test_the_option_defaults_to_off_on_the_cpu_and_rejects_non_booleans():
    assert make_llm(None).engine.async_scheduling is False
    assert make_llm(True).engine.async_scheduling is True
    with pytest.raises(ValueError, match="async_scheduling must be True, False or None"):
        make_llm("yes")
    with pytest.raises(ValueError, match="not supported with tensor_parallel_size > 1"):
        EngineConfig(async_scheduling=True, parallel=ParallelConfig(tensor_parallel_size=2))
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    for argv, value in (([], None), (["--async-scheduling"], True),
                        (["--no-async-scheduling"], False)):
        assert engine_config_from_args(parser.parse_args(argv)).async_scheduling is value


@pytest.mark.parametrize("options", [
    dict(num_gpu_blocks=64),
    dict(num_gpu_blocks=64, max_num_batched_tokens=24),  # prompts prefilled in chunks
    dict(num_gpu_blocks=64, enable_prefix_caching=False, max_num_seqs=3),
])
def test_greedy_outputs_are_unchanged_with_stops_in_the_middle_of_the_batch(options):
    prompts = prompts_with_shared_prefix(8)
    params = stops_midway(prompts, **options)
    sync, overlapped, stats = both(prompts, params, **options)
    assert_same(overlapped, sync)
    assert any(c[0][2] == "stop" for c in sync) and any(c[0][2] == "length" for c in sync)


@pytest.mark.parametrize("tier", ["recompute", "dram", "flash"])
def test_greedy_outputs_are_unchanged_under_preemption(tier, tmp_path):
    options = dict(num_gpu_blocks=9, max_num_batched_tokens=32)
    if tier == "dram":
        options.update(kv_offload="dram", swap_space=0.01)
    elif tier == "flash":
        options.update(kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"),
                       flash_size_gib=0.01)
    prompts = prompts_with_shared_prefix(6, seed=1)
    params = [SamplingParams(max_tokens=20 + 2 * i, temperature=0, ignore_eos=True)
              for i in range(6)]
    # a flash file per run: on the first's, the second run reads the prompts from the prefix
    # store, and whether it still preempts depends on when those reads complete
    sync, overlapped, stats = both(prompts, params, own_flash_files=tier == "flash", **options)
    assert_same(overlapped, sync)
    assert stats["preemptions"] > 0
    if tier != "recompute":
        assert stats["swap_in_blocks"] > 0 and stats["tier_blocks_used"] == 0


@pytest.mark.parametrize("chunk_tokens", [0, 8])
def test_padded_decode_reads_the_pending_tokens_on_the_device(chunk_tokens):
    # chunk_tokens: steps of decodes beside a prompt chunk of <= 8 tokens run padded too
    prompts = prompts_with_shared_prefix(6, seed=2)
    options = dict(num_gpu_blocks=64, long_prefill_token_threshold=chunk_tokens)
    params = stops_midway(prompts, **options)
    results = []
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling, **options)
        runner = llm.engine.runner
        runner.backend = SkipPaddingReference()  # padding slots are not written
        sizes = [1, 2, 4, 8] if chunk_tokens else [1, 2, 4]
        runner.use_padded_decode(llm.engine.limits.max_model_len, sizes, capture=False,
                                 chunk_tokens=chunk_tokens)
        results.append(completions(llm.generate(prompts, params, use_tqdm=False)))
        assert runner.num_padded_decode_steps > 0
        assert (runner.decode_graphs.num_chunk_steps > 0) == bool(chunk_tokens)
    assert_same(results[1], results[0])


def test_sampling_features_give_the_same_outputs():
    prompts = prompts_with_shared_prefix(5, seed=3)
    params = [
        SamplingParams(max_tokens=10, temperature=0, logprobs=3, prompt_logprobs=2),
        SamplingParams(max_tokens=12, temperature=0.8, seed=7, n=3, ignore_eos=True),
        SamplingParams(max_tokens=14, temperature=1.0, seed=8, presence_penalty=0.5,
                       frequency_penalty=0.7, repetition_penalty=1.3, logprobs=2,
                       ignore_eos=True),
        SamplingParams(max_tokens=9, temperature=0.9, seed=9, top_k=20, top_p=0.9, min_p=0.05,
                       min_tokens=6, logit_bias={5: 3.0}, ignore_eos=True),
        SamplingParams(max_tokens=11, temperature=0, repetition_penalty=1.5, n=2,
                       ignore_eos=True),
    ]
    sync, overlapped, _ = both(prompts, params, num_gpu_blocks=64, max_num_batched_tokens=40)
    assert_same(overlapped, sync)


def test_aborts_and_close_with_a_step_in_flight():
    prompts = prompts_with_shared_prefix(3, seed=4)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    expected = make_llm(False, num_gpu_blocks=32).generate(prompts, params, use_tqdm=False)
    engine = LLMEngine.from_options(MODEL, device="cpu", dtype="float32", block_size=16,
                                    num_gpu_blocks=32, async_scheduling=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    assert engine.step() == []  # the prefill is launched; its tokens come with the next call
    streamed: dict[str, list[int]] = {}
    for _ in range(4):
        for out in engine.step():
            streamed[out.request_id] = out.outputs[0].token_ids
    engine.abort_request("r1")
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id != "r1"  # an aborted request gets no further output
            streamed[out.request_id] = out.outputs[0].token_ids
    assert streamed["r0"] == expected[0].token_ids and streamed["r2"] == expected[2].token_ids
    assert len(streamed["r1"]) == 4  # its tokens up to the abort
    engine.add_request("late", prompts[0], params)
    engine.step()
    engine.step()  # one step in flight when the engine closes: its blocks are freed
    engine.close()
    stats = engine.stats()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return str(make_tiny_hf_model(tmp_path_factory.mktemp("async") / "tiny", "llama"))


def test_steps_after_bad_words_apply_the_tokens_during_the_forward_and_keep_the_outputs(
        tiny_hf):
    prompts = ["The quick brown fox", "jumps over", "the lazy dog"]
    free = make_llm(False, tiny_hf).generate(
        prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    words = [o.text.split()[1] for o in free if len(o.text.split()) > 1][:2]
    params = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, bad_words=words),
              SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=4, max_tokens=10, ignore_eos=True,
                             bad_words=words[:1])]
    sync = overlapped = None
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling, tiny_hf, max_model_len=64)
        result = completions(llm.generate(prompts, params, use_tqdm=False))
        if async_scheduling:
            overlapped = result
            # every step samples for a bad-words request: each applies the one before between
            # its forward and its sampling
            stats = llm.stats()
            assert stats["overlapped_steps"] == stats["steps"] - 1
        else:
            sync = result
    assert_same(overlapped, sync)


def test_structured_outputs_apply_the_tokens_during_the_forward_and_keep_the_outputs(tiny_hf):
    pytest.importorskip("xgrammar")
    code = StructuredOutputsParams(regex=r"[a-c]{2,4}-[0-9]{2}")
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=20, structured_outputs=code)
              for s in range(3)]
    params.append(SamplingParams(temperature=0, max_tokens=15, ignore_eos=True))
    prompts = ["Say", "a code:", "now", "free text"]
    results = []
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling, tiny_hf, max_model_len=64)
        results.append(completions(llm.generate(prompts, params, use_tqdm=False)))
        steps, overlapped = llm.stats()["steps"], llm.stats()["overlapped_steps"]
    assert_same(results[1], results[0])
    # every step after the first applies the one before while its forward runs (before its
    # masks are filled); a grammar that ended meanwhile asks for no mask
    assert overlapped == steps - 1


def test_smollm2_outputs_are_unchanged_with_flash_swaps_chunks_and_features(tmp_path):
    system = "You are a helpful assistant who answers in one short sentence. "
    prompts = [system + "The capital of France is", "def fibonacci(n):",
               system + "Name a colour of the sky:", "Flash memory is"]
    params = [SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0, max_tokens=32, ignore_eos=True,
                             repetition_penalty=1.2, presence_penalty=0.3),
              SamplingParams(temperature=0.7, seed=5, n=2, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=40, stop=["memory that"], min_tokens=4,
                             logprobs=1)]
    # the second engine opens the file the first one closed: it also reads its prefix store
    options = dict(max_model_len=96, num_gpu_blocks=9, max_num_batched_tokens=32,
                   kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"),
                   flash_size_gib=0.05, preemption="swap")
    sync, overlapped, stats = both(prompts, params, model="smollm2-135m", **options)
    assert_same(overlapped, sync)
    assert stats["swap_out_blocks"] > 0 and stats["prefix_cache_hits"] > 0
    assert sync[3][0][2:4] == ("stop", "memory that")


def test_switching_the_mode_between_steps_keeps_the_outputs():
    prompts = prompts_with_shared_prefix(4, seed=5)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in
                make_llm(False, num_gpu_blocks=32).generate(prompts, params, use_tqdm=False)]
    engine = LLMEngine.from_options(MODEL, device="cpu", dtype="float32", block_size=16,
                                    num_gpu_blocks=32, async_scheduling=False)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    tokens: dict[str, list[int]] = {}
    num_steps = 0
    while engine.has_unfinished_requests():
        engine.async_scheduling = (num_steps // 3) % 2 == 1  # off, on, off, ... every 3 calls
        outputs = engine.step()
        assert len({o.request_id for o in outputs}) == len(outputs)  # one output per request
        tokens.update({o.request_id: o.outputs[0].token_ids for o in outputs})
        num_steps += 1
    assert [tokens[f"r{i}"] for i in range(4)] == expected
    assert engine.stats()["overlapped_steps"] > 0
