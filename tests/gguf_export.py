"""Write a transformers model as a GGUF file the way llama.cpp's converter lays it out: tensor
names from the ``gguf`` package's own name map, Q/K rows of llama-arch models permuted, Gemma's
norm weights stored as 1 + weight, float32 tensors, no tokenizer."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def _arch(architecture: str):
    from gguf import MODEL_ARCH

    return {"LlamaForCausalLM": MODEL_ARCH.LLAMA, "MistralForCausalLM": MODEL_ARCH.LLAMA,
            "Qwen2ForCausalLM": MODEL_ARCH.QWEN2, "Qwen3ForCausalLM": MODEL_ARCH.QWEN3,
            "Gemma2ForCausalLM": MODEL_ARCH.GEMMA2, "Phi3ForCausalLM": MODEL_ARCH.PHI3}[architecture]


def _permute_rope_halves(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order: per head, the two RoPE halves interleaved row by row."""
    return (w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def export_gguf(model, path: Path, name: str) -> Path:
    """Write ``model`` (a transformers causal LM; its config says the architecture) to ``path``.
    name: general.name (llama.cpp tells Mistral from Llama by it)."""
    import gguf

    cfg = model.config
    architecture = cfg.architectures[0]
    arch = _arch(architecture)
    llama_arch = arch == gguf.MODEL_ARCH.LLAMA
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(name)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_vocab_size(cfg.vocab_size)
    if getattr(cfg, "sliding_window", None) is not None:
        writer.add_sliding_window(cfg.sliding_window)
    if arch == gguf.MODEL_ARCH.GEMMA2:
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if cfg.bos_token_id is not None:
        writer.add_bos_token_id(cfg.bos_token_id)
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = tensor.to(torch.float32).numpy().copy()
        if llama_arch and ".q_proj." in hf_name:
            data = _permute_rope_halves(data, cfg.num_attention_heads)
        elif llama_arch and ".k_proj." in hf_name:
            data = _permute_rope_halves(data, cfg.num_key_value_heads)
        elif arch == gguf.MODEL_ARCH.GEMMA2 and hf_name.endswith("norm.weight"):
            data = data + 1.0
        writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight", ".bias")), data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
