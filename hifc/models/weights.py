"""Copy checkpoint tensors (Hugging Face names) into a model, merging shards where the model
keeps one matrix for several checkpoint tensors (q/k/v, gate/up); the layers that split across
tensor-parallel ranks (linear layers, the vocabulary-split embedding and LM head) keep their
rank's part."""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn

from hifc.layers.embedding import VocabParallelEmbedding
from hifc.layers.linear import Linear, ShardId, copy_weight

# Checkpoint tensors that older exports carry but the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

# checkpoint module name -> (the model's merged module, shard), e.g. "q_proj" -> ("qkv_proj", "q")
ShardMap = Mapping[str, tuple[str, ShardId]]


def _target(name: str, shards: ShardMap) -> tuple[str, ShardId]:
    """The model parameter and shard that checkpoint tensor ``name`` fills."""
    module, _, param = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    if leaf not in shards:
        return name, None
    merged, shard = shards[leaf]
    return f"{parent}.{merged}.{param}" if parent else f"{merged}.{param}", shard


def _missing(model: nn.Module, loaded: set[tuple[str, ShardId]], shards: ShardMap) -> list[str]:
    """Checkpoint names of what was not loaded, in the model's parameter order."""
    missing = []
    for name, _ in model.named_parameters():
        if (name, None) in loaded:
            continue
        module, _, param = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        parts = [(source, shard) for source, (merged, shard) in shards.items() if merged == leaf]
        if not parts:
            missing.append(name)
        missing += [f"{parent}.{source}.{param}" for source, shard in parts
                    if (name, shard) not in loaded]
    return missing


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                 shards: ShardMap) -> None:
    """Copy (name, tensor) pairs into the model, cast to its dtype and device; the linear
    layers and the vocabulary tables place their shards (and take their rank's part). ValueError on an unknown name, a shape mismatch, or weights
    left missing at the end."""
    params = dict(model.named_parameters())
    loaded: set[tuple[str, ShardId]] = set()
    for name, tensor in weights:
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight" and name not in params:
            continue  # tied embeddings (no head of its own): the embedding is the head
        target, shard = _target(name, shards)
        if target not in params:
            raise ValueError(f"checkpoint has an unexpected weight {name!r} for this architecture")
        module = model.get_submodule(target.rpartition(".")[0])
        try:
            if isinstance(module, (Linear, VocabParallelEmbedding)):
                module.load_weight(params[target], tensor, shard)
            else:
                copy_weight(params[target], tensor)
        except ValueError as exc:
            raise ValueError(f"weight {name!r} {exc}") from None
        loaded.add((target, shard))
    missing = _missing(model, loaded, shards)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"missing weights: {len(missing)} tensor(s) not found in the "
                         f"checkpoint: {shown}")
