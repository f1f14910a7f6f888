"""Llama-family decoder (Llama 2/3, Qwen2, Mistral) over the paged attention context.

Parameter names follow Hugging Face's, except that q/k/v are merged into ``qkv_proj`` and
gate/up into ``gate_up_proj`` (fewer launches); ``hifc.models.weights`` maps checkpoints onto them.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import skip_init

from hifc.layers.activation import silu_and_mul
from hifc.layers.attention import AttentionContext
from hifc.layers.norm import RMSNorm
from hifc.layers.rotary import RotaryEmbedding
from hifc.models.config import ModelArchConfig
from hifc.models.weights import load_hf_weights


def _linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
            device: torch.device) -> nn.Linear:
    """An uninitialized Linear (weights come from a checkpoint or the random initializer)."""
    layer = skip_init(nn.Linear, in_features, out_features, bias=bias, device=device, dtype=dtype)
    layer.requires_grad_(False)
    return layer


class LlamaAttention(nn.Module):
    def __init__(self, arch: ModelArchConfig, layer_idx: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = arch.num_attention_heads
        self.num_kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = _linear(arch.hidden_size, self.q_size + 2 * self.kv_size,
                                arch.attention_bias, dtype, device)
        self.o_proj = _linear(self.q_size, arch.hidden_size, False, dtype, device)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, attn: AttentionContext,
                rotary: RotaryEmbedding) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [T, (Hq + 2 Hkv) D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        q, k = rotary(positions, q, k)
        o = attn(self.layer_idx, q, k, v)  # [T, Hq, D]
        return self.o_proj(o.reshape(num_tokens, self.q_size))  # [T, H]


class LlamaMLP(nn.Module):
    def __init__(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.gate_up_proj = _linear(arch.hidden_size, 2 * arch.intermediate_size, False, dtype,
                                    device)
        self.down_proj = _linear(arch.intermediate_size, arch.hidden_size, False, dtype, device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(hidden)))  # [T, H]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ModelArchConfig, layer_idx: int, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.self_attn = LlamaAttention(arch, layer_idx, dtype, device)
        self.mlp = LlamaMLP(arch, dtype, device)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, attn: AttentionContext,
                rotary: RotaryEmbedding) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: this layer's input minus ``residual`` ([T, H]); returns (mlp out, residual)."""
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, attn, rotary)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device,
                 max_positions: int):
        super().__init__()
        self.embed_tokens = skip_init(nn.Embedding, arch.vocab_size, arch.hidden_size,
                                      device=device, dtype=dtype)
        self.embed_tokens.requires_grad_(False)
        self.layers = nn.ModuleList(LlamaDecoderLayer(arch, i, dtype, device)
                                    for i in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.rotary_emb = RotaryEmbedding(arch.head_dim, max_positions, arch.rope_theta,
                                          arch.rope_scaling, dtype, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionContext) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [T, H]
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, attn, self.rotary_emb)
        hidden, _ = self.norm(hidden, residual)
        return hidden  # [T, H]


class LlamaForCausalLM(nn.Module):
    """The decoder plus its LM head. Parameters are uninitialized until weights are loaded."""

    def __init__(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device,
                 max_positions: int | None = None):
        """max_positions: positions RoPE tables cover (default arch.max_position_embeddings)."""
        super().__init__()
        self.arch = arch
        self.dtype = dtype
        self.model = LlamaModel(arch, dtype, torch.device(device),
                                max_positions or arch.max_position_embeddings)
        self.lm_head = (None if arch.tie_word_embeddings else
                        _linear(arch.hidden_size, arch.vocab_size, False, dtype, device))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionContext) -> torch.Tensor:
        """input_ids, positions: [T] int64 (all new tokens of the step). Returns [T, H]."""
        return self.model(input_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H] final-norm states -> [N, vocab] float32 logits."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into this model; ValueError if any are missing."""
        load_hf_weights(self, weights)
