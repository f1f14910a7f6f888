"""The built-in default model (SmolLM2-135M-Instruct GGUF) against transformers, end to end."""
import pytest
import torch

from hifc import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Flash memory differs from DRAM because"]


def test_greedy_matches_transformers_for_32_tokens(smollm2):
    llm, hf, _ = smollm2
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    tok = llm.get_tokenizer()
    with torch.no_grad():
        for prompt, out in zip(PROMPTS, outputs):
            ids = tok.encode(prompt)
            assert out.prompt_token_ids == ids
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                              pad_token_id=0)[0, len(ids):].tolist()
            assert len(out.token_ids) == 32 and out.token_ids == ref
            assert out.text == tok.decode(ref)
    assert "Paris" in outputs[0].text


def test_stop_string_cuts_text(smollm2):
    llm = smollm2[0]
    free = llm.generate(PROMPTS[1], SamplingParams(max_tokens=24, temperature=0),
                        use_tqdm=False)[0]
    stop = free.text.strip()[3:7]
    cut = llm.generate(PROMPTS[1], SamplingParams(max_tokens=24, temperature=0, stop=[stop]),
                       use_tqdm=False)[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:free.text.index(stop)]


def test_chat_applies_template_and_stops_at_eos(smollm2):
    llm = smollm2[0]
    out = llm.chat([{"role": "user", "content": "Say hello."}],
                   SamplingParams(max_tokens=48, temperature=0), use_tqdm=False)[0]
    assert out.text.strip()
    if out.finish_reason == "stop":
        assert out.token_ids[-1] in llm.get_tokenizer().eos_token_ids
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "no role"}], use_tqdm=False)
