"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over the paged attention context.

Parameter names follow Hugging Face's, except that q/k/v are merged into ``qkv_proj`` and
gate/up into ``gate_up_proj`` (fewer launches); ``CHECKPOINT_SHARDS`` says which checkpoint
tensor fills which part. The other families (Qwen3, Gemma 2, Phi-3) build on these classes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hifc.layers.attention import AttentionContext, Rope
from hifc.layers.embedding import VocabParallelEmbedding
from hifc.layers.linear import (MergedColumnLinear, QKVLinear, RowLinear, ShardId,
                                project_then_norm)
from hifc.layers.norm import RMSNorm
from hifc.layers.rotary import RotaryEmbedding
from hifc.layers.tensor_parallel import SINGLE, TPShard
from hifc.models.config import ModelArchConfig, common_hf_fields

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# checkpoint module name -> (hifc module it is merged into, shard)
CHECKPOINT_SHARDS: dict[str, tuple[str, ShardId]] = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


def arch_from_hf(config: PretrainedConfig, architecture: str) -> ModelArchConfig:
    """Llama / Mistral: the common fields; their bias options are not implemented."""
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise ValueError(f"{architecture}: attention_bias/mlp_bias checkpoints are not supported")
    return ModelArchConfig(architecture=architecture, hidden_act=config.hidden_act,
                           **common_hf_fields(config))


def qwen2_arch_from_hf(config: PretrainedConfig, architecture: str) -> ModelArchConfig:
    """Qwen2: Llama with a bias on the q/k/v projections."""
    return ModelArchConfig(architecture=architecture, hidden_act=config.hidden_act,
                           attention_bias=True, **common_hf_fields(config))


class LlamaAttention(nn.Module):
    """Self-attention over this rank's query and KV heads (all of them with one rank)."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, dtype: torch.dtype,
                 device: torch.device, tp: TPShard = SINGLE):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = tp.split(arch.num_attention_heads)
        self.num_kv_heads = tp.split(arch.num_key_value_heads)
        self.head_dim = arch.head_dim
        self.qkv_proj = QKVLinear(arch.hidden_size, arch.num_attention_heads,
                                  arch.num_key_value_heads, self.head_dim, arch.attention_bias,
                                  dtype, device, tp)
        self.o_proj = RowLinear(arch.num_attention_heads * self.head_dim, arch.hidden_size, False,
                                dtype, device, tp)

    def normalize_qk(self, q: torch.Tensor,
                     k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head q/k normalization before RoPE: none in Llama (Qwen3 has one)."""
        return q, k

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, attn: AttentionContext,
                rotary: RotaryEmbedding, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The output of every row, or of the rows ``keep`` lists, attended and projected alone
        (every row's K/V is written)."""
        o = self.attention(positions, self.qkv_proj(hidden), attn, rotary, keep)
        if not o.shape[0]:
            return o.new_empty(0, self.o_proj.weight.shape[0])  # no row kept
        return self.o_proj(o)

    def attention_normed(self, norm: RMSNorm, positions: torch.Tensor, hidden: torch.Tensor,
                         residual: torch.Tensor | None, attn: AttentionContext,
                         rotary: RotaryEmbedding, keep: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention output before the output projection ([T, Hq*D], or [N, Hq*D] of the
        rows ``keep`` lists) of ``norm(hidden, residual)``'s normed states, and its residual
        sum ([T, H] of every row; the norm runs inside the QKV projection where it can)."""
        qkv, residual = self.qkv_proj.forward_normed(norm, hidden, residual)
        return self.attention(positions, qkv, attn, rotary, keep), residual

    def attention(self, positions: torch.Tensor, qkv: tuple[torch.Tensor, ...],
                  attn: AttentionContext, rotary: RotaryEmbedding,
                  keep: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of the projected (q, k, v) ([T, H*D] each) -> [T, Hq*D], or [N, Hq*D] of
        the rows ``keep`` lists (every row's K/V is written), before the output projection."""
        q, k, v = qkv
        num_tokens = q.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        q, k = self.normalize_qk(q, k)
        o = attn(self.layer_idx, q, k, v, Rope(rotary, positions), keep)  # RoPE applied
        return o.reshape(o.shape[0], self.num_heads * self.head_dim)


class LlamaMLP(nn.Module):
    """down(act(gate) * up) with gate and up as one matrix."""

    def __init__(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device,
                 tp: TPShard = SINGLE):
        super().__init__()
        inter = arch.intermediate_size
        self.gate_up_proj = MergedColumnLinear(arch.hidden_size, [inter, inter], False, dtype,
                                               device, tp)
        self.down_proj = RowLinear(inter, arch.hidden_size, False, dtype, device, tp)
        self.hidden_act = arch.hidden_act  # a key of GATED_ACTIVATIONS (the config checks)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(hidden))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The down projection of the gate-up projection's output ([T, 2I]) -> [T, H]."""
        return self.down_proj.forward_gated(gate_up, self.hidden_act)


class LlamaDecoderLayer(nn.Module):
    attention_class = LlamaAttention

    def __init__(self, arch: ModelArchConfig, layer_idx: int, dtype: torch.dtype,
                 device: torch.device, tp: TPShard = SINGLE):
        super().__init__()
        self.self_attn = self.attention_class(arch, layer_idx, dtype, device, tp)
        self.mlp = LlamaMLP(arch, dtype, device, tp)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, attn: AttentionContext,
                rotary: RotaryEmbedding,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: this layer's input minus ``residual`` ([T, H]); returns (mlp out, residual)
        of every row, or of the rows ``keep`` lists ([N, H]; every row's K/V is written). The
        input norm runs inside the QKV projection, and the residual add and norm after the
        attention inside the output and gate-up projections, where they can take them."""
        o, residual = self.self_attn.attention_normed(self.input_layernorm, positions, hidden,
                                                      residual, attn, rotary, keep)
        if keep is not None:
            residual = residual.index_select(0, keep)
            if not keep.shape[0]:
                return residual, residual  # [0, H] each
        gate_up, residual = project_then_norm(self.self_attn.o_proj, o, residual,
                                              self.post_attention_layernorm,
                                              self.mlp.gate_up_proj)
        return self.mlp.down(gate_up), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers of ``layer_class``, final norm, and the RoPE tables."""

    norm_unit_offset = False  # RMSNorm scales by weight (Gemma: by 1 + weight)

    def __init__(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device,
                 max_positions: int, layer_class: type[nn.Module], tp: TPShard = SINGLE):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, dtype,
                                                   device, tp)
        self.layers = nn.ModuleList(layer_class(arch, i, dtype, device, tp)
                                    for i in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype, device,
                            self.norm_unit_offset)
        self.rotary_emb = RotaryEmbedding(arch.head_dim, max_positions, arch.rope_theta,
                                          arch.rope_scaling, dtype, device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)  # [T, H]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionContext, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Final-norm states of every token ([T, H]), or of the tokens ``keep`` lists ([N, H]):
        the last layer's attention, output projection and MLP then run on those alone."""
        hidden = self.embed(input_ids)  # [T, H]
        residual = None
        *body, last = self.layers
        for layer in body:
            hidden, residual = layer(positions, hidden, residual, attn, self.rotary_emb)
        hidden, residual = last(positions, hidden, residual, attn, self.rotary_emb, keep)
        if not hidden.shape[0]:
            return hidden  # no token kept
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """The decoder plus its LM head. Parameters are uninitialized until weights are loaded.
    With ``tp`` (see :mod:`hifc.layers.tensor_parallel`), this rank's part of them: its heads,
    its MLP features and its vocabulary range (``check_divides`` says which sizes split).

    attention_layers: each layer's LayerAttention, which the runtime's attention context reads.
    """

    model_class = LlamaModel
    decoder_layer = LlamaDecoderLayer

    def __init__(self, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device,
                 max_positions: int | None = None, tp: TPShard = SINGLE):
        """max_positions: positions RoPE tables cover (default arch.max_position_embeddings)."""
        super().__init__()
        self.arch = arch
        self.dtype = dtype
        self.tp = tp
        self.attention_layers = arch.attention_layers()
        self.model = self.model_class(arch, dtype, torch.device(device),
                                      max_positions or arch.max_position_embeddings,
                                      self.decoder_layer, tp)
        self.lm_head = (None if arch.tie_word_embeddings else
                        VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, dtype, device,
                                               tp))

    @property
    def head(self) -> VocabParallelEmbedding:
        """The table the logits are computed with: the LM head, or the tied embedding."""
        return self.model.embed_tokens if self.lm_head is None else self.lm_head

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionContext, keep: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: [T] int64 (all new tokens of the step). Returns the final-norm
        states [T, H], or [N, H] of the N tokens ``keep`` lists (int64 indices into the step's
        tokens, on the device): only those tokens' outputs need the last layer's output
        projection and MLP, as every token's K/V is written before them."""
        return self.model(input_ids, positions, attn, keep)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H] final-norm states -> [N, vocab] logits in the model's dtype (float32
        where the architecture soft-caps them, capped in float32), gathered over the ranks'
        vocabulary ranges. Consumers that need float32 convert (the sampler does only when a
        row's sampling asks for more than a greedy argmax)."""
        logits = self.head.logits(hidden)  # [N, V]
        cap = self.arch.final_logit_softcap
        return logits if cap is None else torch.tanh(logits.float() / cap) * cap
