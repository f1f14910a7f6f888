"""The runner's start-up warm-up steps (``ModelRunner.warm_up``): prompts run into the cache's
first blocks before any sequence holds one, leaving nothing a later request sees."""
import torch

from hifc import LLMEngine, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [[3 + (7 * i + j) % 500 for j in range(n)] for i, n in enumerate((1, 5, 40, 130))]
BLOCK = 16


def engine(**options) -> LLMEngine:
    return LLMEngine.from_options("random:tiny-llama", device="cpu", dtype="float32",
                                  num_gpu_blocks=64, block_size=BLOCK, **options)


def generate(llm: LLMEngine) -> list[list[int]]:
    for i, prompt in enumerate(PROMPTS):
        llm.add_request(str(i), prompt, GREEDY)
    done = {}
    while llm.has_unfinished_requests():
        for out in llm.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    return [done[str(i)] for i in range(len(PROMPTS))]


def test_warm_up_writes_only_its_blocks_and_changes_no_later_output():
    plain, warmed = engine(), engine()
    cache = warmed.runner.kv_cache  # [L, 2, NB, BS, Hkv, D]
    before = cache.clone()
    warmed.runner.warm_up(warmed.limits.max_model_len)  # on the CPU: no steps by default
    assert torch.equal(cache, before)
    warmed.runner.warm_up(warmed.limits.max_model_len, lengths=(2, 17, 130))
    used = -(-130 // BLOCK)
    assert not torch.equal(cache[:, :, :used], before[:, :, :used])
    assert torch.equal(cache[:, :, used:], before[:, :, used:])
    assert generate(warmed) == generate(plain)


def test_warm_up_leaves_out_prompts_past_the_model_length():
    llm = engine(max_model_len=64)
    cache = llm.runner.kv_cache
    before = cache.clone()
    llm.runner.warm_up(llm.limits.max_model_len, lengths=(2, 128))
    assert not torch.equal(cache[:, :, 0], before[:, :, 0])  # the 2-token prompt ran
    assert torch.equal(cache[:, :, 1:], before[:, :, 1:])  # the 128-token one did not
