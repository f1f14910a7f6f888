"""Helpers shared by the tier tests (import as ``tests.tiers.tier_helpers``)."""
from __future__ import annotations

import torch

from hifc.tiers import KVGeometry

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def random_kv(geometry: KVGeometry, num_blocks: int, device="cpu", seed: int = 0) -> torch.Tensor:
    """A KV cache ``[L, 2, num_blocks, block_size, kv_heads, head_dim]`` of random values."""
    gen = torch.Generator().manual_seed(seed)
    shape = (geometry.num_layers, 2, num_blocks, geometry.block_size, geometry.num_kv_heads,
             geometry.head_dim)
    return torch.randn(shape, generator=gen).to(DTYPES[geometry.dtype]).to(device)


SMALL = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=32, block_size=16, dtype="float16")
