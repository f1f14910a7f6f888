"""End-to-end generation through LLM / LLMEngine, checked against transformers."""
import pytest
import torch

from hifc import LLM, LLMEngine, SamplingParams
from tests.fixtures import make_tiny_hf_model

PROMPTS = [[1, 5, 9, 13, 2, 7], [3, 3, 8], list(range(10, 40)), [42]]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def hf_greedy(model_dir, prompt_ids, n):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    out = []
    for ids in prompt_ids:
        gen = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             min_new_tokens=n, pad_token_id=0)
        out.append(gen[0, len(ids):].tolist())
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def tiny_model(request, tmp_path_factory):
    return make_tiny_hf_model(tmp_path_factory.mktemp(request.param), request.param)


def test_greedy_matches_transformers(tiny_model):
    llm = LLM(str(tiny_model), device="cpu", block_size=16)
    ours = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert ours == hf_greedy(tiny_model, PROMPTS, 16)


def test_batch_equals_one_at_a_time_and_recompute_preemption(tiny_model):
    ref = LLM(str(tiny_model), device="cpu", block_size=16)
    batch = [o.token_ids for o in ref.generate(PROMPTS, GREEDY, use_tqdm=False)]
    single = [ref.generate([p], GREEDY, use_tqdm=False)[0].token_ids for p in PROMPTS]
    assert batch == single
    # 5 blocks of 16 tokens cannot hold all four sequences: forces preemption by recompute.
    tight = LLM(str(tiny_model), device="cpu", block_size=16, num_gpu_blocks=5)
    preempted = [o.token_ids for o in tight.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert preempted == batch
    stats = tight.stats()
    assert stats["preemptions"] > 0 and stats["recomputed_sequences"] > 0
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"] == 5


def test_blocks_free_after_finish_and_abort(tiny_model):
    engine = LLMEngine.from_options(str(tiny_model), device="cpu", block_size=16)
    total = engine.stats()["gpu_blocks_total"]
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=50, temperature=0.8, seed=i))
    engine.step()
    engine.step()
    engine.abort_request(["r0", "r2"])
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["gpu_blocks_free"] == total
    engine.add_request("late", PROMPTS[0], GREEDY)
    engine.step()
    engine.abort_request("late")
    assert not engine.has_unfinished_requests()
    assert engine.stats()["gpu_blocks_free"] == total


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_model):
    llm = LLM(str(tiny_model), device="cpu", block_size=16)
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=20, seed=7,
                            ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].token_ids
    batched = llm.generate(PROMPTS, params, use_tqdm=False)[0].token_ids
    assert alone == batched
    other = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=1.0, seed=8,
                                                      ignore_eos=True), use_tqdm=False)
    assert other[0].token_ids != alone


def test_stop_token_ids_and_max_tokens(tiny_model):
    llm = LLM(str(tiny_model), device="cpu", block_size=16)
    free_run = llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False)[0]
    assert len(free_run.token_ids) == 16 and free_run.finish_reason == "length"
    stop_at = free_run.token_ids[3]
    stopped = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=16, temperature=0,
                           stop_token_ids=[stop_at], ignore_eos=True), use_tqdm=False)[0]
    first = free_run.token_ids.index(stop_at)
    assert stopped.token_ids == free_run.token_ids[:first + 1]
    assert stopped.finish_reason == "stop"


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=""), "prompt is empty"),
    (dict(prompts=[[]]), "prompt is empty"),
    (dict(prompts=[list(range(1, 200))]), "maximum model length is 128"),
    (dict(prompts=[[1, 10**9]]), "outside the vocabulary"),
])
def test_bad_prompts_get_clear_errors(tiny_model, kwargs, message):
    llm = LLM(str(tiny_model), device="cpu", block_size=16, max_model_len=128)
    with pytest.raises(ValueError, match=message):
        llm.generate(kwargs["prompts"], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids  # still usable


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(temperature=-0.5), "temperature must be non-negative"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(seed=2**64), "seed must be an integer in"),
    (dict(seed=-1), "seed must be an integer in"),
])
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_unknown_model_and_options():
    with pytest.raises(ValueError, match="no-such-model"):
        LLM("no-such-model", device="cpu")
    with pytest.raises(TypeError, match="unknown engine option"):
        LLM("random:tiny-llama", device="cpu", blok_size=16)
    with pytest.raises(ValueError, match="block_size"):
        LLM("random:tiny-llama", device="cpu", block_size=48)


def test_random_preset_runs_with_token_ids():
    llm = LLM("random:tiny-llama", device="cpu", num_gpu_blocks=16, block_size=16)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.token_ids) == 5 and out.text == ""
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("hello", use_tqdm=False)
