"""The built-in default model (SmolLM2-135M-Instruct GGUF) against transformers' GGUF loader."""
import pytest
import torch

from hifc import LLM, SamplingParams
from tests.fixtures import smollm2_gguf_path

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Flash memory differs from DRAM because"]


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m", device="cpu", block_size=16, max_model_len=512)


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM
    path = smollm2_gguf_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                torch_dtype=torch.float32)


def test_greedy_matches_transformers_for_32_tokens(llm, hf_model):
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    tok = llm.get_tokenizer()
    for prompt, out in zip(PROMPTS, outputs):
        ids = tok.encode(prompt)
        assert out.prompt_token_ids == ids
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32,
                                do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
        assert out.token_ids == ref
        assert out.text == tok.decode(ref)


def test_stop_string_cuts_text(llm):
    free = llm.generate(PROMPTS[1], SamplingParams(max_tokens=24, temperature=0),
                        use_tqdm=False)[0]
    stop = free.text.strip()[3:7]
    cut = llm.generate(PROMPTS[1], SamplingParams(max_tokens=24, temperature=0, stop=[stop]),
                       use_tqdm=False)[0]
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and free.text.startswith(cut.text)
    assert cut.text == free.text[:free.text.index(stop)]


def test_chat_applies_template_and_stops_at_eos(llm):
    out = llm.chat([{"role": "user", "content": "Say hello."}],
                   SamplingParams(max_tokens=48, temperature=0), use_tqdm=False)[0]
    assert out.text.strip()
    if out.finish_reason == "stop":
        assert out.token_ids[-1] in llm.get_tokenizer().eos_token_ids
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "no role"}], use_tqdm=False)
