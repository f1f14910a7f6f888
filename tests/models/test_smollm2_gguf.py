"""SmolLM2-135M-Instruct (Q4_1 GGUF) through our loader and model against transformers' GGUF path."""
import pytest
import torch

from tests.fixtures import greedy_decode_paged

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def test_arch_matches_transformers_parse(smollm2):
    llm, _, parsed = smollm2
    arch = llm.engine.arch
    assert llm.engine.model_name == "smollm2-135m" and arch.architecture == "LlamaForCausalLM"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim",
                "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(arch, key) == parsed[key], key
    assert arch.rope_theta == pytest.approx(parsed["rope_theta"])
    assert arch.rms_norm_eps == pytest.approx(parsed["rms_norm_eps"])
    assert arch.eos_token_ids == (parsed["eos_token_id"],)


def test_prefill_logits_match_transformers(smollm2):
    llm, hf, _ = smollm2
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    _, prefill = greedy_decode_paged(llm.engine.runner.model, prompts, num_tokens=1, block_size=16)
    with torch.no_grad():
        for prompt, logits in zip(prompts, prefill):
            ref_logits = hf(torch.tensor([prompt])).logits[0]
            torch.testing.assert_close(logits, ref_logits, atol=5e-4, rtol=1e-4)


def test_tokenizer_and_chat_template_from_gguf_metadata(smollm2):
    tok = smollm2[0].get_tokenizer()
    assert tok.eos_token_ids == frozenset({2})
    ids = tok.encode("Hello world")
    assert ids == [19556, 905] and tok.decode(ids) == "Hello world"
    assert tok.decode([1] + ids + [2]) == "Hello world"
    assert tok.decode([1] + ids, skip_special_tokens=False) == "<|im_start|>Hello world"
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                       add_generation_prompt=False).endswith("assistant\n")
