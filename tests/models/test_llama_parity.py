"""Our Llama-family model against transformers on tiny random models (fp32, paged KV cache)."""
import pytest
import torch

from hifc.loader import load_model
from tests.fixtures import greedy_decode_paged, make_tiny_hf_model

PROMPTS = [[1, 5, 9, 13, 2, 7], [3, 3, 8], list(range(10, 40)), [42]]


@pytest.fixture(scope="module", params=["llama", "llama3", "qwen2", "mistral"])
def tiny(request, tmp_path_factory):
    """(our loaded model, transformers' model) for one tiny architecture."""
    from transformers import AutoModelForCausalLM
    path = make_tiny_hf_model(tmp_path_factory.mktemp(request.param), request.param)
    ours = load_model(str(path), torch.float32, torch.device("cpu"))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return ours, hf


def test_batched_prefill_logits_match_transformers(tiny):
    ours, hf = tiny
    _, prefill_logits = greedy_decode_paged(ours.model, PROMPTS, num_tokens=1)
    with torch.no_grad():
        for prompt, logits in zip(PROMPTS, prefill_logits):
            ref = hf(torch.tensor([prompt])).logits[0]  # [P, V]
            assert logits.dtype == torch.float32 and logits.shape == ref.shape
            torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_paged_greedy_decode_matches_generate(tiny):
    ours, hf = tiny
    generated, _ = greedy_decode_paged(ours.model, PROMPTS, num_tokens=20, block_size=4)
    for prompt, tokens in zip(PROMPTS, generated):
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
        assert tokens == ref[0, len(prompt):].tolist()


def test_block_size_does_not_change_tokens(tiny):
    ours, _ = tiny
    small, _ = greedy_decode_paged(ours.model, PROMPTS[:2], num_tokens=8, block_size=1)
    large, _ = greedy_decode_paged(ours.model, PROMPTS[:2], num_tokens=8, block_size=64)
    assert small == large


def test_arch_reflects_the_checkpoint(tiny):
    ours, hf = tiny
    arch, cfg = ours.arch, hf.config
    assert arch.architecture == cfg.architectures[0]
    assert arch.tie_word_embeddings == cfg.tie_word_embeddings
    assert arch.attention_bias == (arch.architecture == "Qwen2ForCausalLM")
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == (4, 2, 16)
    assert arch.sliding_window == (512 if arch.architecture == "MistralForCausalLM" else None)
    rope_type = (cfg.rope_parameters or {}).get("rope_type", "default")
    assert (arch.rope_scaling or {}).get("rope_type", "default") == rope_type
