"""SmolLM2-135M-Instruct (Q4_1 GGUF) through our loader and model against transformers' GGUF path."""
import pytest
import torch

from hifc.loader import load_model
from tests.fixtures import greedy_decode_paged, hf_model_from_gguf, smollm2_gguf_path

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def smollm2():
    """(ours, transformers' model, the config transformers parsed from the file)."""
    from transformers import LlamaConfig
    ours = load_model("smollm2-135m", torch.float32, torch.device("cpu"))
    arch = ours.arch
    # Build transformers' model from our parsed shapes (saves one slow pass over the file);
    # the config transformers parses while loading the tensors is checked below.
    config = LlamaConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim, rms_norm_eps=arch.rms_norm_eps, rope_theta=arch.rope_theta,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings, bos_token_id=1, eos_token_id=2)
    hf, parsed = hf_model_from_gguf(smollm2_gguf_path(), config=config)
    return ours, hf, parsed


def test_arch_matches_transformers_parse(smollm2):
    ours, _, parsed = smollm2
    arch = ours.arch
    assert ours.name == "smollm2-135m" and arch.architecture == "LlamaForCausalLM"
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim",
                "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(arch, key) == parsed[key], key
    assert arch.rope_theta == pytest.approx(parsed["rope_theta"])
    assert arch.rms_norm_eps == pytest.approx(parsed["rms_norm_eps"])
    assert arch.eos_token_ids == (parsed["eos_token_id"],)


def test_greedy_32_tokens_match_transformers(smollm2):
    ours, hf, _ = smollm2
    prompts = [ours.tokenizer.encode(p) for p in PROMPTS]
    eos = tuple(ours.arch.eos_token_ids)  # min_new_tokens masks these in transformers
    tokens, prefill = greedy_decode_paged(ours.model, prompts, num_tokens=32, block_size=16,
                                          suppress_ids=eos)
    with torch.no_grad():
        for prompt, toks, logits in zip(prompts, tokens, prefill):
            ref_logits = hf(torch.tensor([prompt])).logits[0]
            torch.testing.assert_close(logits, ref_logits, atol=5e-4, rtol=1e-4)
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32,
                              do_sample=False, pad_token_id=0)
            assert toks == ref[0, len(prompt):].tolist()
    assert "Paris" in ours.tokenizer.decode(tokens[0])


def test_tokenizer_and_chat_template_from_gguf_metadata(smollm2):
    tok = smollm2[0].tokenizer
    assert tok.eos_token_ids == frozenset({2})
    ids = tok.encode("Hello world")
    assert ids == [19556, 905] and tok.decode(ids) == "Hello world"
    assert tok.decode([1] + ids + [2]) == "Hello world"
    assert tok.decode([1] + ids, skip_special_tokens=False) == "<|im_start|>Hello world"
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template([{"role": "user", "content": "Hi"}],
                                       add_generation_prompt=False).endswith("assistant\n")
