"""Session-wide fixtures shared across test packages."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2():
    """(our LLM on SmolLM2-135M GGUF, transformers' model of the same file, transformers' parsed
    config). Loaded once per session: each load takes seconds."""
    import torch
    from transformers import LlamaConfig

    from hifc import LLM
    from tests.fixtures import hf_model_from_gguf, smollm2_gguf_path

    llm = LLM("smollm2-135m", device="cpu", block_size=16, max_model_len=512)
    arch = llm.engine.arch
    config = LlamaConfig(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim, rms_norm_eps=arch.rms_norm_eps, rope_theta=arch.rope_theta,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings, bos_token_id=1, eos_token_id=None)
    hf, parsed = hf_model_from_gguf(smollm2_gguf_path(), torch.float32, config=config)
    hf.generation_config.eos_token_id = None  # run on past EOS, like ignore_eos=True
    return llm, hf, parsed
