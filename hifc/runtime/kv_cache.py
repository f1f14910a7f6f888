"""The engine's KV tensor and its sizing."""
from __future__ import annotations

import torch

from hifc.models.config import ModelArchConfig


def kv_bytes_per_block(arch: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block id occupies across all layers, K and V."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_hidden_layers * block_size * arch.num_key_value_heads * arch.head_dim * itemsize


def allocate_kv_cache(arch: ModelArchConfig, num_blocks: int, block_size: int,
                      dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One tensor [L, 2, num_blocks, block_size, Hkv, D]; block (l, k, b) is contiguous."""
    shape = (arch.num_hidden_layers, 2, num_blocks, block_size, arch.num_key_value_heads,
             arch.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)
