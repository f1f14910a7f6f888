"""CPU KV caches: gather with in-cache checksums, and verify-then-scatter, one block at a time.

The CPU stages of :mod:`hifc.tiers.flash.pipeline` run while I/O is in flight, and on a small VM they
slow that I/O down: copies that write memory compete with the disk's own transfers (measured on
the 2-core CPU machine: a thread copying memory took raw O_DIRECT writes from 2.7 to 1.8 GiB/s,
one running crc32c to 2.5 GiB/s). So for KV caches in host memory the stages move as few bytes
through DRAM as they can:

* copies are numpy copies (a ``memcpy`` per contiguous slice: single-threaded, the GIL released,
  no OpenMP team started from a tier thread) on integer views of the tensors (numpy has no
  bfloat16; a copy does not care);
* swap-out: each layer's slices are copied into staging and their crc32c computed right away,
  while the bytes are still in the CPU cache, instead of in a second pass over the whole chunk;
* swap-in: each block is verified (header and every slice crc) and, only if it passes, copied
  into the KV cache at once, while its bytes are still cached. A block that fails verification
  is never copied; the other blocks of the chunk are (a failed swap-in leaves its destination
  blocks undefined, see :class:`~hifc.tiers.tier.KVTier`; a prefix read uses the blocks that
  passed).

GPU KV caches keep the torch path in :mod:`hifc.tiers.flash.chunks` (gathers and scatters are GPU
kernels there; only the checksums run on the host).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from hifc.tiers.flash.layout import ChunkPlan
from hifc.tiers.geometry import runs_of
from hifc.tiers.flash.records import slice_crcs

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def int_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy) of a CPU tensor, as integers of the same width."""
    return tensor.detach().view(_INT_OF_WIDTH[tensor.element_size()]).numpy()


def gather_with_crcs(kv: np.ndarray, ids: list[int], data: np.ndarray, host: memoryview,
                     plan: ChunkPlan, slice_bytes: int) -> list[list[int]]:
    """``data[:, :, i] = kv[:, :, ids[i]]`` layer by layer; returns, per block of the chunk,
    the crc32c of its slices in (layer, K/V) order, computed on ``host`` (the staging bytes that
    ``data`` views) right after each layer is copied."""
    num_layers = kv.shape[0]
    runs = runs_of(ids)
    crcs = [[0] * (2 * num_layers) for _ in range(plan.n)]
    for layer in range(num_layers):
        for first, at, length in runs:
            np.copyto(data[layer, :, at:at + length], kv[layer, :, first:first + length])
        for i in range(plan.n):
            offsets = [plan.slice_offset(i, layer, kind) for kind in (0, 1)]
            crcs[i][2 * layer:2 * layer + 2] = slice_crcs(host, offsets, slice_bytes)
    return crcs


def verify_then_scatter(kv: np.ndarray, ids: list[int], data: np.ndarray,
                        verify_block: Callable[[int], bool]) -> list[int]:
    """For each block ``i`` of the chunk: if ``verify_block(i)`` (False: the record is bad),
    ``kv[:, :, ids[i]] = data[:, :, i]``. Returns the ``i`` copied."""
    delivered = []
    for i, block in enumerate(ids):
        if verify_block(i):
            np.copyto(kv[:, :, block], data[:, :, i])
            delivered.append(i)
    return delivered
