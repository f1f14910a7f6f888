"""``TierMover``: the worker side of a swap tier, which moves one rank's KV cache to and from
its storage (staging, I/O, checksums), on threads of its own.

A tier is split in two, as vLLM v1 splits it: the block space (allocation, reservation, pins,
the prefix index, jobs: :class:`~hifc.tiers.tier.KVTier`, in the engine's process) decides which
tier blocks hold what; a mover per tensor-parallel rank moves that rank's shard of those blocks
(its own cache file or DRAM pool). With one rank the tier holds its mover; with several, the
engine's tier holds rank 0's and the other ranks' movers get the same orders
(:mod:`hifc.parallel.tp_io`), so a job's I/O runs on every rank at once.
"""
from __future__ import annotations

import concurrent.futures as cf
from abc import ABC, abstractmethod
from typing import Callable

import torch

SWAP_OUT = "swap_out"
SWAP_IN = "swap_in"


class TierMover(ABC):
    kind = ""

    @abstractmethod
    def launch(self, op: str, kv_cache: torch.Tensor, pairs: list[tuple[int, int]],
               owner: tuple[int, int], ready,
               staged: Callable[[int, int], None] | None = None) -> list[cf.Future]:
        """Start a swap (``op`` SWAP_OUT: pairs (KV block, tier block); SWAP_IN: (tier block,
        KV block)); one future per independent piece of work, each giving the bytes it moved.
        ``kv_cache`` is the ``copy_view`` of the cache; ``ready``: a CUDA event the copies
        wait for (None on the CPU). A swap-out whose data waits in the mover's memory before
        it is stored calls ``staged(first, count)`` (a worker thread) once
        ``pairs[first:first + count]`` are copied out of ``kv_cache``; a mover whose copy ends
        the job need not."""

    def launch_prefix(self, op: str, kv_cache: torch.Tensor, pairs: list[tuple[int, int]],
                      salt: bytes, hashes: tuple[bytes, ...], done: bytearray,
                      ready) -> list[cf.Future]:
        """Start a prefix-store write or read (flash only): as ``launch``, the records stamped
        with ``salt`` and ``hashes[i]``; ``done[i]`` set to 1 once pair i is on the file
        (write) or verified in the KV cache (read)."""
        raise ValueError(f"a {self.kind} tier keeps no prefix store")

    def cancel_queued(self) -> None:
        """Work not started yet may fail as cancelled from now on (before a close)."""

    @abstractmethod
    def close(self) -> None:
        """Release threads, files and memory; call once every job has ended."""

    def stats(self) -> dict:
        return {}
