"""Qwen3: the Llama decoder plus an RMSNorm over each head of q and k before RoPE, with an
explicit head_dim (not hidden_size / heads) and no q/k/v bias."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hifc.layers.norm import RMSNorm
from hifc.layers.tensor_parallel import SINGLE, TPShard
from hifc.models.config import ModelArchConfig, common_hf_fields
from hifc.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def arch_from_hf(config: PretrainedConfig, architecture: str) -> ModelArchConfig:
    if config.attention_bias:
        raise ValueError(f"{architecture}: attention_bias checkpoints are not supported")
    return ModelArchConfig(architecture=architecture, hidden_act=config.hidden_act,
                           **common_hf_fields(config))


class Qwen3Attention(LlamaAttention):
    def __init__(self, arch: ModelArchConfig, layer_idx: int, dtype: torch.dtype,
                 device: torch.device, tp: TPShard = SINGLE):
        super().__init__(arch, layer_idx, dtype, device, tp)
        self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps, dtype, device)  # [D]
        self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps, dtype, device)  # [D]

    def normalize_qk(self, q: torch.Tensor,
                     k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hkv, D] (this rank's heads), each head normalized over D."""
        return self.q_norm(q)[0], self.k_norm(k)[0]


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_class = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    decoder_layer = Qwen3DecoderLayer
