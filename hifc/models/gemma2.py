"""Gemma 2: the Llama decoder with a scaled embedding, RMSNorms that scale by (1 + weight), four
norms per layer (around attention and around the MLP), a GeGLU MLP (tanh GELU), the attention
scale from query_pre_attn_scalar, soft-capped attention scores and logits, and a sliding window
on alternate layers (transformers' layer_types)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hifc.layers.attention import AttentionContext
from hifc.layers.norm import RMSNorm
from hifc.layers.rotary import RotaryEmbedding
from hifc.layers.tensor_parallel import SINGLE, TPShard
from hifc.models.config import ModelArchConfig, common_hf_fields
from hifc.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, LlamaModel

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def arch_from_hf(config: PretrainedConfig, architecture: str) -> ModelArchConfig:
    if config.attention_bias:
        raise ValueError(f"{architecture}: attention_bias checkpoints are not supported")
    return ModelArchConfig(architecture=architecture, hidden_act=config.hidden_activation,
                           attention_scale=config.query_pre_attn_scalar ** -0.5,
                           attn_logit_softcap=config.attn_logit_softcapping,
                           final_logit_softcap=config.final_logit_softcapping,
                           **common_hf_fields(config))


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArchConfig, layer_idx: int, dtype: torch.dtype,
                 device: torch.device, tp: TPShard = SINGLE):
        super().__init__()
        self.self_attn = LlamaAttention(arch, layer_idx, dtype, device, tp)
        self.mlp = LlamaMLP(arch, dtype, device, tp)

        def norm() -> RMSNorm:
            return RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device, unit_offset=True)

        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, attn: AttentionContext,
                rotary: RotaryEmbedding,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: this layer's input minus ``residual`` ([T, H]); returns (mlp out, residual)
        of every row, or of the rows ``keep`` lists ([N, H]; every row's K/V is written)."""
        hidden, residual = self.input_layernorm(hidden, residual)
        if keep is not None:
            residual = residual.index_select(0, keep)
        hidden = self.self_attn(positions, hidden, attn, rotary, keep)
        if not hidden.shape[0]:
            return hidden, residual  # no row kept: [0, H] each
        hidden, _ = self.post_attention_layernorm(hidden)
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        hidden, _ = self.post_feedforward_layernorm(self.mlp(hidden))
        return hidden, residual


class Gemma2Model(LlamaModel):
    norm_unit_offset = True

    def __init__(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device,
                 max_positions: int, layer_class: type[nn.Module], tp: TPShard = SINGLE):
        super().__init__(arch, dtype, device, max_positions, layer_class, tp)
        # sqrt(hidden) rounded to the model dtype, as transformers multiplies it (bf16: 55.5 for
        # hidden 3072, not 55.4256)
        self.embed_scale = torch.tensor(arch.hidden_size ** 0.5).to(dtype).item()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale  # [T, H]


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_class = Gemma2Model
    decoder_layer = Gemma2DecoderLayer


def gguf_derived_config(fields: dict[str, Any]) -> dict[str, Any]:
    """query_pre_attn_scalar, which GGUF files do not carry: llama.cpp scales scores by
    head_dim ** -0.5, except in Gemma-2 27B (46 layers) by (hidden_size / heads) ** -0.5."""
    if fields["num_hidden_layers"] == 46:
        return {"query_pre_attn_scalar": fields["hidden_size"] // fields["num_attention_heads"]}
    return {"query_pre_attn_scalar": fields["head_dim"]}
