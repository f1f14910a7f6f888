"""Map Hugging Face checkpoint names onto LlamaForCausalLM, merging q/k/v and gate/up."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch

from hifc.models.config import ModelArchConfig

if TYPE_CHECKING:
    from hifc.models.llama import LlamaForCausalLM

# Checkpoint tensors that older exports carry but the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expected_weight_names(arch: ModelArchConfig) -> list[str]:
    """Every Hugging Face tensor name a checkpoint of this architecture must provide."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not arch.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(arch.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj"):
            names.append(f"{prefix}self_attn.{proj}.weight")
            if arch.attention_bias:
                names.append(f"{prefix}self_attn.{proj}.bias")
        names.append(f"{prefix}self_attn.o_proj.weight")
        names += [f"{prefix}mlp.{proj}.weight" for proj in ("gate_proj", "up_proj", "down_proj")]
        names += [f"{prefix}input_layernorm.weight", f"{prefix}post_attention_layernorm.weight"]
    return names


def _shards(arch: ModelArchConfig) -> dict[str, tuple[str, int, int]]:
    """checkpoint projection -> (merged projection, row offset, rows)."""
    q_size = arch.num_attention_heads * arch.head_dim
    kv_size = arch.num_key_value_heads * arch.head_dim
    inter = arch.intermediate_size
    return {
        "q_proj": ("qkv_proj", 0, q_size),
        "k_proj": ("qkv_proj", q_size, kv_size),
        "v_proj": ("qkv_proj", q_size + kv_size, kv_size),
        "gate_proj": ("gate_up_proj", 0, inter),
        "up_proj": ("gate_up_proj", inter, inter),
    }


def _destination(name: str, params: dict[str, torch.Tensor],
                 shards: dict[str, tuple[str, int, int]]) -> torch.Tensor:
    """The parameter (or the rows of a merged one) that checkpoint tensor ``name`` fills."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in shards:
        merged, offset, rows = shards[parts[-2]]
        target = ".".join(parts[:-2] + [merged, parts[-1]])
        if target in params:
            return params[target].narrow(0, offset, rows)
    if name in params:
        return params[name]
    raise ValueError(f"checkpoint has an unexpected weight {name!r} for this architecture")


@torch.no_grad()
def load_hf_weights(model: "LlamaForCausalLM",
                    weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy (name, tensor) pairs into the model, casting to its dtype and device.

    Raises ValueError on an unknown name, a shape mismatch, or weights left missing at the end.
    """
    arch = model.arch
    params = dict(model.named_parameters())
    shards = _shards(arch)
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight" and arch.tie_word_embeddings:
            continue  # tied: the embedding is the head
        dst = _destination(name, params, shards)
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, "
                             f"the model expects {tuple(dst.shape)}")
        dst.copy_(tensor)
        loaded.add(name)
    missing = [name for name in expected_weight_names(arch) if name not in loaded]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"missing weights: {len(missing)} tensor(s) not found in the "
                         f"checkpoint: {shown}")
