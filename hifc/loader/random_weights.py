"""Seeded random weights, generated directly on the model's device (an 8B model in seconds)."""
from __future__ import annotations

import torch
from torch import nn

from hifc.layers.norm import RMSNorm


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Norm weights at their identity value (1, or 0 where the norm scales by 1 + weight), every
    other parameter N(0, std), from one generator on the model's device.

    The same seed gives the same weights on the same kind of device.
    """
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    norm_weights = {id(m.weight): m.identity_weight for m in model.modules()
                    if isinstance(m, RMSNorm)}
    for param in model.parameters():
        if id(param) in norm_weights:
            param.fill_(norm_weights[id(param)])
        else:
            param.normal_(0.0, std, generator=generator)
