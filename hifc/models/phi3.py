"""Phi-3: the Llama decoder, with checkpoints that store q/k/v as one ``qkv_proj`` and gate/up
as one ``gate_up_proj`` (hifc's own layout, so no tensor is split or merged), a sliding window
on every layer where the config sets one, and LongRoPE scaling in the long-context variants."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hifc.layers.linear import ShardId
from hifc.models.config import ModelArchConfig, common_hf_fields
from hifc.models.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The checkpoint's fused projections are hifc's: nothing to merge.
CHECKPOINT_SHARDS: dict[str, tuple[str, ShardId]] = {}


def arch_from_hf(config: PretrainedConfig, architecture: str) -> ModelArchConfig:
    rotary_fraction = (config.rope_parameters or {}).get("partial_rotary_factor", 1.0)
    if rotary_fraction != 1.0:
        raise ValueError(f"{architecture}: partial_rotary_factor {rotary_fraction} is not "
                         f"supported (RoPE over whole heads only)")
    fields = common_hf_fields(config)
    scaling = fields["rope_scaling"]
    if scaling is not None and scaling.get("factor") is None:
        # LongRoPE (the only scaling Phi-3 configs allow); transformers' default factor is the
        # ratio of the extended context to the original one
        original = scaling["original_max_position_embeddings"]
        fields["rope_scaling"] = {**scaling, "factor": config.max_position_embeddings / original}
    return ModelArchConfig(architecture=architecture, hidden_act=config.hidden_act, **fields)


class Phi3ForCausalLM(LlamaForCausalLM):
    """The Llama decoder; only the checkpoint layout and the config differ."""
