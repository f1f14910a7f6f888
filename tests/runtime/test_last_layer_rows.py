"""The last layer's attention, output projection and MLP run on the rows whose logits a step
needs: the last new token of each sequence that samples, every row when prompt logprobs are
asked for."""
from unittest import mock

import pytest

from hifc import LLM, SamplingParams
from tests.fixtures import make_tiny_hf_model

PROMPTS = [list(range(3, 43)), [5, 6, 7], list(range(50, 73))]  # 40, 3 and 23 tokens


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = make_tiny_hf_model(tmp_path_factory.mktemp("llama"), "llama")
    return LLM(str(path), device="cpu", dtype="float32", block_size=16, num_gpu_blocks=32,
               max_model_len=128, max_num_batched_tokens=32, max_num_seqs=4)


def _o_proj_rows(llm, params):
    """Rows of every call of the first and the last layer's output projection, in order."""
    layers = llm.engine.runner.model.model.layers
    calls = []
    hooks = [layer.self_attn.o_proj.register_forward_hook(
        lambda module, args, out, name=name: calls.append((name, args[0].shape[0])))
        for name, layer in (("first", layers[0]), ("last", layers[-1]))]
    try:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        for hook in hooks:
            hook.remove()
    return calls, outputs


def test_the_last_layer_runs_on_the_sampled_rows(llm):
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    backend = llm.engine.runner.backend
    with mock.patch.object(backend, "forward", wraps=backend.forward) as forward, \
            mock.patch.object(backend, "forward_kept", wraps=backend.forward_kept) as kept:
        calls, _ = _o_proj_rows(llm, greedy)
    # Steps of 32 tokens: the 40-token prompt's first chunk (nothing samples: the last layer
    # skips its output projection); its last 8 tokens, the 3-token prompt and 21 tokens of the
    # 23-token one (two sample); two decodes and its last 2 tokens (three); then decodes.
    assert calls == [("first", 32), ("first", 32), ("last", 2), ("first", 4), ("last", 3),
                     ("first", 3), ("last", 3), ("first", 1), ("last", 1)]
    # The last layer's attention (forward_kept) writes every row's K/V and attends those rows
    # alone; in a step whose rows all sample, every layer's attention takes every row.
    assert [(c.args[0].shape[0], c.args[5].index.shape[0]) for c in kept.call_args_list] == [
        (32, 0), (32, 2), (4, 3)]
    body = len(llm.engine.runner.model.model.layers) - 1
    assert [c.args[0].shape[0] for c in forward.call_args_list] == (
        [32] * body + [32] * body + [4] * body + [3] * (body + 1) + [1] * (body + 1))


def test_prompt_logprobs_keep_every_row(llm):
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
    calls, outputs = _o_proj_rows(llm, params)
    steps = [n for name, n in calls if name == "first"]
    assert [n for name, n in calls if name == "last"] == steps  # every step, every row
    assert [len(o.prompt_logprobs) for o in outputs] == list(map(len, PROMPTS))

