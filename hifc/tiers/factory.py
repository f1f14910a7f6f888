"""``make_tier``: builds the swap tier a ``TierConfig`` describes; ``make_mover``: a
tensor-parallel worker rank's mover for it."""
from __future__ import annotations

import torch

from hifc.dtypes import dtype_name
from hifc.tiers.config import TierConfig
from hifc.tiers.dram import DramMover, DramTier
from hifc.tiers.flash.arbiter import DeviceShare
from hifc.tiers.flash.layout import blocks_for_bytes
from hifc.tiers.flash.mover import FlashMover
from hifc.tiers.flash.tier import FlashTier
from hifc.tiers.geometry import KVGeometry
from hifc.tiers.mover import TierMover
from hifc.tiers.tier import KVTier, TierPeers

GIB = 1 << 30


def geometry_of(kv_cache: torch.Tensor, scale_digest: str = "") -> KVGeometry:
    """The block geometry of an engine KV cache ``[L, 2, N, block_size, kv_heads, head_dim]``
    (a float8 one with the digest of its scales)."""
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
        raise ValueError("kv_cache must be a tensor [layers, 2, blocks, block_size, kv_heads, "
                         "head_dim]")
    layers, _, _, block_size, heads, head_dim = kv_cache.shape
    return KVGeometry(layers, heads, head_dim, block_size, dtype_name(kv_cache.dtype),
                      scale_digest)


def num_blocks_for(config: TierConfig, geometry: KVGeometry) -> int:
    """Tier blocks of ``geometry`` (one rank's) in the configured size (each rank's file or
    DRAM pool is that size)."""
    if config.num_tier_blocks is not None:
        return config.num_tier_blocks
    size = int(config.size_gib * GIB)
    n = (blocks_for_bytes(config.flash_layout, geometry, size) if config.kv_offload == "flash"
         else size // geometry.block_bytes)
    if n < 1:
        raise ValueError(f"a tier of {config.size_gib} GiB holds no block of "
                         f"{geometry.block_bytes} bytes")
    return n


def make_tier(config: TierConfig, geometry: KVGeometry, device="cpu",
              device_share: DeviceShare | None = None, peers: TierPeers | None = None) -> KVTier:
    """Build the tier described by ``config`` for KV caches of ``geometry`` on ``device``;
    ``device_share``: the flash device's arbiter, where other replicas share it; ``peers``: the
    other tensor-parallel ranks' movers."""
    if not isinstance(geometry, KVGeometry):
        raise ValueError("make_tier needs a KVGeometry (see geometry_of(kv_cache))")
    if not config.enabled:
        raise ValueError("kv_offload='none' configures no tier")
    n = num_blocks_for(config, geometry)
    if config.kv_offload == "dram":
        return DramTier(geometry, n, policy=config.flash_policy, device=device, peers=peers)
    return FlashTier(geometry, n, config, device=device, device_share=device_share, peers=peers)


def make_mover(config: TierConfig, geometry: KVGeometry, device, shard: tuple[int, int]
               ) -> TierMover:
    """Tensor-parallel rank ``shard[0]`` of ``shard[1]``: its mover for the tier ``config``
    describes (``config.flash_path``: that rank's file), as many blocks as rank 0's tier."""
    n = num_blocks_for(config, geometry)
    if config.kv_offload == "dram":
        return DramMover(geometry, n, device=device)
    return FlashMover(geometry, n, config, device=device, shard=shard)
