"""Architecture presets for random-weight models: real sizes for benchmarks, tiny ones for tests."""
from __future__ import annotations

import dataclasses
from types import MappingProxyType

from hifc.models.config import FULL, SLIDING, ModelArchConfig

_LLAMA31_ROPE = MappingProxyType({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192})


def _alternating(num_layers: int) -> tuple[str, ...]:
    """Gemma 2's layer_types: sliding window on even layers, full attention on odd ones."""
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))


def _qwen25(intermediate_size: int, num_hidden_layers: int) -> ModelArchConfig:
    """DeepSeek-R1-Distill-Qwen-{14B,32B}: Qwen2.5 shapes with q/k/v bias."""
    return ModelArchConfig(
        architecture="Qwen2ForCausalLM", vocab_size=152064, hidden_size=5120,
        intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        rope_theta=1000000.0, max_position_embeddings=131072, attention_bias=True,
        bos_token_id=151646, eos_token_ids=(151643,))


PRESETS: MappingProxyType[str, ModelArchConfig] = MappingProxyType({
    # DeepSeek-R1-Distill-Llama-8B = Llama-3.1-8B shapes, llama3 rope scaling.
    "ds-r1-llama-8b": ModelArchConfig(
        architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=dict(_LLAMA31_ROPE), max_position_embeddings=131072,
        bos_token_id=128000, eos_token_ids=(128001,)),
    "ds-r1-qwen-14b": _qwen25(intermediate_size=13824, num_hidden_layers=48),
    "ds-r1-qwen-32b": _qwen25(intermediate_size=27648, num_hidden_layers=64),
    # Mistral-7B-Instruct-v0.3 (no sliding window in v0.3).
    "mistral-7b": ModelArchConfig(
        architecture="MistralForCausalLM", vocab_size=32768, hidden_size=4096,
        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=1000000.0,
        max_position_embeddings=32768, bos_token_id=1, eos_token_ids=(2,)),
    # Qwen3-8B: q/k norms, explicit head_dim, no q/k/v bias.
    "qwen3-8b": ModelArchConfig(
        architecture="Qwen3ForCausalLM", vocab_size=151936, hidden_size=4096,
        intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, bos_token_id=151643, eos_token_ids=(151645, 151643)),
    # Gemma-2-9B: sliding window 4096 on even layers, soft-capping, GeGLU, tied embeddings.
    "gemma2-9b": ModelArchConfig(
        architecture="Gemma2ForCausalLM", vocab_size=256000, hidden_size=3584,
        intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=8192, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh",
        sliding_window=4096, layer_types=_alternating(42), attention_scale=256 ** -0.5,
        attn_logit_softcap=50.0, final_logit_softcap=30.0, bos_token_id=2,
        eos_token_ids=(1, 107)),
    # Phi-3-mini-4k-instruct: MHA with head_dim 96, sliding window 2047 on every layer.
    "phi3-mini": ModelArchConfig(
        architecture="Phi3ForCausalLM", vocab_size=32064, hidden_size=3072,
        intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, head_dim=96, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=4096, sliding_window=2047, bos_token_id=1,
        eos_token_ids=(32000, 32001, 32007)),
    # Tiny test models (about 100k parameters): GQA 4:2 (Phi-3: MHA), head_dim 16 (Qwen3: 32,
    # not hidden / heads); sliding windows short enough for tests to cross.
    "tiny-llama": ModelArchConfig(
        architecture="LlamaForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_theta=10000.0, max_position_embeddings=1024,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
        bos_token_id=1, eos_token_ids=(2,)),
    "tiny-qwen2": ModelArchConfig(
        architecture="Qwen2ForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=1024,
        tie_word_embeddings=True, attention_bias=True, bos_token_id=1, eos_token_ids=(2,)),
    "tiny-mistral": ModelArchConfig(
        architecture="MistralForCausalLM", vocab_size=512, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=1000000.0,
        max_position_embeddings=1024, sliding_window=48, bos_token_id=1, eos_token_ids=(2,)),
    "tiny-qwen3": ModelArchConfig(
        architecture="Qwen3ForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=1024,
        bos_token_id=1, eos_token_ids=(2,)),
    "tiny-gemma2": ModelArchConfig(
        architecture="Gemma2ForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rms_norm_eps=1e-6, max_position_embeddings=1024, tie_word_embeddings=True,
        hidden_act="gelu_pytorch_tanh", sliding_window=40, layer_types=_alternating(2),
        attention_scale=32 ** -0.5, attn_logit_softcap=50.0, final_logit_softcap=30.0,
        bos_token_id=1, eos_token_ids=(2,)),
    "tiny-phi3": ModelArchConfig(
        architecture="Phi3ForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
        max_position_embeddings=1024, sliding_window=56, bos_token_id=1, eos_token_ids=(2,)),
})


def preset_arch(name: str) -> ModelArchConfig:
    """The architecture of preset ``name``; ValueError listing the presets if unknown."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    arch = PRESETS[name]
    # A fresh rope_scaling dict, so no caller can alter the shared preset through it.
    return dataclasses.replace(arch, rope_scaling=dict(arch.rope_scaling or {}) or None)
