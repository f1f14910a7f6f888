"""Seeded random weights, generated directly on the model's device (an 8B model in seconds)."""
from __future__ import annotations

from typing import Iterator

import torch

from hifc.layers.norm import RMSNorm
from hifc.models.config import ModelArchConfig
from hifc.models.registry import ArchitectureSpec


@torch.no_grad()
def random_checkpoint(spec: ArchitectureSpec, arch: ModelArchConfig, dtype: torch.dtype,
                      device: torch.device, seed: int,
                      std: float = 0.02) -> Iterator[tuple[str, torch.Tensor]]:
    """The whole model's parameters by name, in the model's order, as a checkpoint would give
    them: norm weights at their identity value (1, or 0 where the norm scales by 1 + weight),
    every other parameter N(0, std), from one generator on ``device``. Each is made when asked
    for, so a tensor-parallel rank keeps its part of one parameter at a time and every rank
    gets the values one process does.

    The same seed gives the same weights on the same kind of device.
    """
    shapes = spec.build(arch, dtype, "meta")  # names and shapes, no memory
    generator = torch.Generator(device=device).manual_seed(seed)
    norm_weights = {f"{name}.weight": m.identity_weight for name, m in shapes.named_modules()
                    if isinstance(m, RMSNorm)}
    for name, param in shapes.named_parameters():
        if name in norm_weights:
            yield name, torch.full(param.shape, norm_weights[name], dtype=dtype, device=device)
        else:
            yield name, torch.empty(param.shape, dtype=dtype, device=device).normal_(
                0.0, std, generator=generator)
