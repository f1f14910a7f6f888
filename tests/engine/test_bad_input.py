"""Bad values and wrong types through the Python API: clear ValueErrors naming the field, nothing
queued, the engine still usable; values at the edge of meaning get a defined behaviour."""
import pytest

from hifc import LLM, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("random:tiny-llama", device="cpu", block_size=16, num_gpu_blocks=16)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("inf")), "temperature must be a finite number"),
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(temperature=1e300), r"temperature must be at most 100, got 1e\+300"),
    (dict(temperature=10**400), "temperature must be a finite number, got an integer of"),
    (dict(temperature="0.5"), "temperature must be a finite number"),
    (dict(top_k=-2), r"top_k must be -1 or 0 \(disabled\), or at least 1, got -2"),
    (dict(top_k=-10**30), "top_k must be .* got an integer of 100 bits"),
    (dict(top_k=2.0), "top_k must be an integer"),
    (dict(top_p=True), "top_p must be a finite number"),
    (dict(seed=2**80), r"seed must be an integer in \[0, 2\*\*63\), got an integer of 81 bits"),
    (dict(stop=5), "stop must be a string or a list of strings, got int"),
    (dict(stop=["ok", 5]), "stop strings must be non-empty strings, got 5"),
    (dict(stop_token_ids=5), "stop_token_ids must be a list of token ids, got int"),
    (dict(stop_token_ids="12"), "stop_token_ids must be a list of token ids, got str"),
    (dict(ignore_eos="no"), "ignore_eos must be True or False, got 'no'"),
    (dict(skip_special_tokens=1), "skip_special_tokens must be True or False"),
    (dict(max_tokens=2.0), "max_tokens must be an integer"),
])
def test_meaningless_sampling_values_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_temperature_below_epsilon_is_greedy(llm):
    """1e-40 divided into float32 logits overflowed them to NaN (token 0 repeated); like vLLM,
    temperatures below 1e-5 now mean greedy."""
    greedy = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids
    for temperature in (1e-40, 1e-6):
        tiny = SamplingParams(max_tokens=6, temperature=temperature, ignore_eos=True, seed=1)
        assert tiny.greedy
        assert llm.generate([[1, 2, 3]], tiny, use_tqdm=False)[0].token_ids == greedy
    assert not SamplingParams(temperature=1e-4).greedy


@pytest.mark.parametrize("params, message", [
    (SamplingParams(stop_token_ids=[512]), r"stop_token_ids contains 512, outside the "
                                           r"vocabulary \(0..511\)"),
    (SamplingParams(top_k=10**30), r"top_k must be at most the vocabulary size \(512\), got an "
                                   r"integer of 100 bits"),
])
def test_values_beyond_the_vocabulary_are_refused_before_anything_is_queued(llm, params,
                                                                            message):
    with pytest.raises(ValueError, match=message):
        llm.generate([[1, 2], [3, 4]], [GREEDY, params], use_tqdm=False)
    with pytest.raises(ValueError, match=message):
        llm.engine.add_request("r", [1, 2], params)
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate([[1, 2]], GREEDY, use_tqdm=False)[0].token_ids


@pytest.mark.parametrize("call, message", [
    (lambda m: m.generate([None]), r"prompts\[0\] must be a string or a list of token ids, "
                                   r"got NoneType"),
    (lambda m: m.generate(["ok", 5]), r"prompts\[1\] must be a string or a list of token ids, "
                                      r"got int"),
    (lambda m: m.generate(b"hi"), "prompts must be a string, a list of token ids, or a list of "
                                  "those, got bytes"),
    (lambda m: m.generate(5), "prompts must be .* got int"),
    (lambda m: m.generate([[1, "a"]]), "prompt token ids must be integers"),
    (lambda m: m.generate([1, 2], sampling_params=5), "sampling_params must be a SamplingParams "
                                                      "or a list of them, got int"),
    (lambda m: m.generate([1, 2], sampling_params=[5]), "sampling_params must be a "
                                                        "SamplingParams, got int"),
    (lambda m: m.chat(5), "messages must be a non-empty list"),
    (lambda m: m.chat(None), "messages must be a non-empty list"),
])
def test_wrong_types_are_value_errors(llm, call, message):
    with pytest.raises(ValueError, match=message):
        call(llm)
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("options, message", [
    (dict(kv_cache_gib=float("inf")), r"kv_cache_gib must be a number of GiB in \(0, 1048576\]"),
    (dict(kv_cache_gib=float("nan")), "kv_cache_gib must be a number of GiB"),
    (dict(seed=2**80), r"seed must be an integer in \[0, 2\*\*63\)"),
    (dict(seed=-1), r"seed must be an integer in \[0, 2\*\*63\)"),
    (dict(device=5), "device must be auto, cpu, cuda or cuda:N"),
    (dict(gpu_memory_utilization="0.9"), r"gpu_memory_utilization must be in \(0, 1\]"),
    (dict(kv_offload="flash", flash_path=5, flash_size_gib=1), "flash_path must be a path"),
    (dict(kv_offload="dram", swap_space=float("inf")), "swap_space must be a number of GiB"),
    (dict(cpu_threads=0), "cpu_threads must be a positive integer"),
])
def test_bad_engine_options_are_value_errors(options, message):
    with pytest.raises(ValueError, match=message):
        LLM("random:tiny-llama", **options)
