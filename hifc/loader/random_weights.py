"""Seeded random weights, generated directly on the model's device (an 8B model in seconds)."""
from __future__ import annotations

import torch

from hifc.layers.norm import RMSNorm
from hifc.models.llama import LlamaForCausalLM


@torch.no_grad()
def init_random_weights(model: LlamaForCausalLM, seed: int, std: float = 0.02) -> None:
    """Norm weights 1, every other parameter N(0, std), from one generator on the model's device.

    The same seed gives the same weights on the same kind of device.
    """
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    norm_weights = {id(m.weight) for m in model.modules() if isinstance(m, RMSNorm)}
    for param in model.parameters():
        if id(param) in norm_weights:
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=generator)
