"""``TierConfig`` and ``make_tier``: how the engine builds its swap tier."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hifc.tiers.allocator import POLICIES
from hifc.tiers.dram import DramTier
from hifc.tiers.flash import BACKENDS, FlashTier
from hifc.tiers.layout import DEFAULT_LAYOUT, LAYOUTS, KVGeometry, blocks_for_bytes
from hifc.tiers.tier import KVTier

KINDS = ("flash", "dram")
GIB = 1 << 30


@dataclass(frozen=True)
class TierConfig:
    """What the tier should be. Give exactly one of ``size_gib`` and ``num_blocks``."""

    kind: str = "flash"  # "flash" | "dram"
    path: str | None = None  # cache file (flash only)
    size_gib: float | None = None  # file size (flash) or pool size (dram)
    num_blocks: int | None = None
    policy: str = "append"  # "append" | "left-append"
    layout: str = DEFAULT_LAYOUT  # "block-record" | "layer-kv"
    io_threads: int = 8  # flash: threads that only issue I/O (the device's queue depth)
    prep_threads: int | None = None  # flash: gather/checksum/scatter threads (None: auto)
    backend: str = "auto"  # "auto" | "kvikio" | "posix"
    chunk_mib: int = 32  # largest coalesced I/O (staging: io_threads + prep_threads chunks)
    direct_io: bool = True  # ask for O_DIRECT; falls back to buffered where refused
    force: bool = False  # reinitialise an existing file that is not an hifc cache file
    fault_injection: bool = False  # expose tier.faults (tests)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"tier kind must be one of {list(KINDS)}, got {self.kind!r}")
        if self.kind == "flash" and not self.path:
            raise ValueError("a flash tier needs a cache file path")
        if (self.size_gib is None) == (self.num_blocks is None):
            raise ValueError("give exactly one of size_gib and num_blocks")
        if self.size_gib is not None and not 0 < self.size_gib < math.inf:
            raise ValueError(f"size_gib must be positive and finite, got {self.size_gib!r}")
        if self.num_blocks is not None and (not isinstance(self.num_blocks, int)
                                            or self.num_blocks <= 0):
            raise ValueError(f"num_blocks must be a positive int, got {self.num_blocks!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {list(POLICIES)}, got {self.policy!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {self.layout!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.io_threads, int) or not 1 <= self.io_threads <= 256:
            raise ValueError(f"io_threads must be an int in [1, 256], got {self.io_threads!r}")
        if self.prep_threads is not None and (not isinstance(self.prep_threads, int)
                                              or not 1 <= self.prep_threads <= 256):
            raise ValueError(f"prep_threads must be an int in [1, 256], got {self.prep_threads!r}")
        if not isinstance(self.chunk_mib, int) or not 1 <= self.chunk_mib <= 1024:
            raise ValueError(f"chunk_mib must be an int in [1, 1024], got {self.chunk_mib!r}")


def geometry_of(kv_cache: torch.Tensor) -> KVGeometry:
    """The block geometry of an engine KV cache ``[L, 2, N, block_size, kv_heads, head_dim]``."""
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 6 or kv_cache.shape[1] != 2:
        raise ValueError("kv_cache must be a tensor [layers, 2, blocks, block_size, kv_heads, "
                         "head_dim]")
    layers, _, _, block_size, heads, head_dim = kv_cache.shape
    return KVGeometry(layers, heads, head_dim, block_size, str(kv_cache.dtype).split(".")[-1])


def num_blocks_for(config: TierConfig, geometry: KVGeometry) -> int:
    if config.num_blocks is not None:
        return config.num_blocks
    size = int(config.size_gib * GIB)
    n = (blocks_for_bytes(config.layout, geometry, size) if config.kind == "flash"
         else size // geometry.block_bytes)
    if n < 1:
        raise ValueError(f"size_gib={config.size_gib} holds no block of "
                         f"{geometry.block_bytes} bytes")
    return n


def make_tier(config: TierConfig, geometry: KVGeometry, device="cpu") -> KVTier:
    """Build the tier described by ``config`` for KV caches of ``geometry`` on ``device``."""
    if not isinstance(geometry, KVGeometry):
        raise ValueError("make_tier needs a KVGeometry (see geometry_of(kv_cache))")
    n = num_blocks_for(config, geometry)
    if config.kind == "dram":
        return DramTier(geometry, n, policy=config.policy, device=device)
    return FlashTier(geometry, n, config.path, policy=config.policy, layout=config.layout,
                     io_threads=config.io_threads, backend=config.backend, device=device,
                     chunk_mib=config.chunk_mib, direct_io=config.direct_io, force=config.force,
                     fault_injection=config.fault_injection, prep_threads=config.prep_threads)
