"""``FlashTier``: KV blocks swapped to a preallocated cache file on an SSD.

The tier's block space (allocation in log order through the prefix index, reservations, pins,
jobs); the file and its I/O are this rank's :class:`~hifc.tiers.flash.mover.FlashMover` (and,
with tensor parallelism, the other ranks' movers through ``peers``: every rank a file of its
own, the same tier blocks in each).

A swap-out reports each chunk's pairs staged (``take_staged``) once they are gathered into its
staging buffers: the engine reuses those GPU blocks while the chunk's write goes on, the
buffers holding the only copy until it ends. Those are host sets (``flash_staging_mib``, 1 GiB
by default), apart from the few GPU buffers where chunks are gathered, so a swap-out up to
that size is staged, and freed, at copy speed; a larger one stages the rest chunk by chunk as
earlier writes give their sets back. Freeing only
once the whole swap-out is staged would hold every block of a large one until all but its last
few chunks are on disk: nearly as long as the write itself.

The same log holds the prefix store (:mod:`hifc.tiers.flash.prefix_store`): ``lookup_prefix``,
``submit_prefix_write`` and ``submit_prefix_read`` keep full KV blocks by content hash, across
restarts (a reopened file's index is rebuilt from its record headers,
:mod:`hifc.tiers.flash.scan`: rank 0's file; the other ranks' records are verified as they are
read). Reservations go through the prefix index (:mod:`hifc.tiers.flash.prefix_index`), which
overwrites prefix records as the log comes round.
"""
from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext

import torch

from hifc.tiers.config import TierConfig
from hifc.tiers.flash.arbiter import DeviceShare
from hifc.tiers.flash.mover import FlashMover
from hifc.tiers.flash.posix_io import open_data_fd
from hifc.tiers.flash.prefix_index import PrefixIndex
from hifc.tiers.flash.prefix_store import (
    PREFIX_READ, PREFIX_WRITE, WRITE_LIMIT_CHUNKS, PrefixStore, check_key, check_read_pairs,
    check_write_pairs,
)
from hifc.tiers.flash.scan import ScanResult, scan_headers
from hifc.tiers.geometry import KVGeometry
from hifc.tiers.jobs import IOOrder, PrefixJob, RankOutcome
from hifc.tiers.tier import KVTier, TierPeers, copy_view, ready_event


class FlashTier(KVTier):
    kind = "flash"

    def __init__(self, geometry: KVGeometry, num_blocks: int, config: TierConfig, *,
                 device="cpu", device_share: DeviceShare | None = None,
                 peers: TierPeers | None = None):
        """``peers``: the other tensor-parallel ranks' movers (this is rank 0's file)."""
        ranks = peers.size if peers is not None else 1
        mover = FlashMover(geometry, num_blocks, config, device=device,
                           device_share=device_share, shard=(0, ranks))
        try:
            super().__init__(geometry, num_blocks, config.flash_policy, mover, peers)
        except BaseException:
            mover.close()
            mover.cache_file.discard()
            raise
        self.index = PrefixIndex(self.allocator)
        try:
            scan = self._rebuild_index(config) if config.stores_prefixes else None
        except BaseException:
            mover.close()
            raise
        if scan is not None:
            mover.chunks.next_lsn = scan.next_lsn
        write_limit = WRITE_LIMIT_CHUNKS * mover.chunks.max_chunk_blocks * mover.pipeline_depth
        self.prefix = PrefixStore(self.index, self.block_bytes, geometry.block_size,
                                  enabled=config.stores_prefixes, scan=scan,
                                  write_limit=max(1, min(num_blocks // 2, write_limit)))

    # -- this rank's file ----------------------------------------------------------------------
    @property
    def layout(self):
        return self.mover.layout

    @property
    def cache_file(self):
        return self.mover.cache_file

    @property
    def io(self):
        return self.mover.io

    @property
    def faults(self):
        """The fault injector of this rank's I/O (tier_fault_injection), else None."""
        return self.mover.faults

    def _rebuild_index(self, config: TierConfig) -> ScanResult | None:
        """A reused file: index its prefix records, and resume the log after its newest."""
        if not self.cache_file.reused:
            return None
        fd, _, _ = open_data_fd(self.cache_file.fd, self.cache_file.path,
                                config.flash_direct_io)
        try:
            scan = scan_headers(fd, self.layout, config.flash_io_threads)
        finally:
            os.close(fd)
        self.index.load(scan.records)
        self.allocator.seek(scan.head)
        return scan

    @property
    def epoch(self) -> int:
        return self.mover.epoch

    # -- one log for swap and prefix records ---------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks a reservation can have now: free ones and unpinned prefix records."""
        return self.index.num_reservable

    def can_reserve(self, n: int) -> bool:
        return self.index.can_reserve(n)

    def reserve(self, n: int) -> list[int]:
        """Reserve ``n`` tier blocks in policy order, overwriting the prefix records the log
        reaches (never one with a read in flight). ValueError if fewer are reservable."""
        self._check_open()
        return self.index.reserve(n)

    def _is_reserved(self, block) -> bool:
        return super()._is_reserved(block) and not self.index.owns(block)

    # -- prefix store ----------------------------------------------------------------------------
    def lookup_prefix(self, hashes, salt: bytes, count: bool = True) -> int:
        """How many leading ``hashes`` (32-byte content hashes of consecutive full blocks) are
        stored under the model ``salt`` (32 bytes) and can be read now. Changes nothing stored
        (the query and its hits are counted in ``stats()``, unless ``count`` is False: the
        engine counts what it admits itself)."""
        return self.prefix.lookup(hashes, salt, count)

    def submit_prefix_write(self, kv_cache: torch.Tensor, pairs, salt: bytes) -> PrefixJob:
        """Store blocks ``kv_cache[:, :, gpu_block]`` under their hashes; pairs are
        ``(gpu_block, block_hash)``. Hashes already stored or being written are skipped, and
        so is what does not fit (free log space, a bound on writes in flight); the job covers
        the rest, appended to the log like swap records. Its completion publishes the blocks
        written (``blocks_ok``); until then the GPU blocks must not change."""
        self._check_open()
        self.prefix.require_enabled()
        check_key("salt", salt)
        self._check_kv(kv_cache)
        pairs = check_write_pairs(pairs)
        self._check_gpu_ids(kv_cache, [g for g, _ in pairs])
        todo = self.prefix.select_writes(pairs, salt, self.index.num_reservable)
        tier_ids = self.index.reserve(len(todo))
        job = PrefixJob(self._new_job_id(), PREFIX_WRITE,
                        tuple((g, b) for (g, _), b in zip(todo, tier_ids)), (0, 0), salt=salt,
                        hashes=tuple(h for _, h in todo), requested=len(pairs),
                        skipped=len(pairs) - len(todo), _done=bytearray(len(todo)))
        if tier_ids:
            self.allocator.mark_written(tier_ids)
        return self._start_prefix(job, kv_cache)

    def submit_prefix_read(self, kv_cache: torch.Tensor, pairs, salt: bytes) -> PrefixJob:
        """Read stored blocks into ``kv_cache``; pairs are ``(block_hash, gpu_block)``, the
        chain from its first block. The job covers the leading hashes stored now. Every record
        is verified (magic, kind, block id, salt, hash, header and payload crcs) before a byte
        of it reaches ``kv_cache``; one that fails is dropped from the index (a miss from then
        on) and fails the job (INTEGRITY, or the I/O error). Either way, once done, the first
        ``job.blocks_ok`` GPU blocks hold the stored KV; recompute from there on."""
        self._check_open()
        self.prefix.require_enabled()
        check_key("salt", salt)
        self._check_kv(kv_cache)
        pairs = check_read_pairs(pairs)
        self._check_gpu_ids(kv_cache, [g for _, g in pairs])
        found = self.prefix.select_reads(pairs, salt)
        job = PrefixJob(self._new_job_id(), PREFIX_READ, tuple((b, g) for b, g, _ in found),
                        (0, 0), salt=salt, hashes=tuple(h for _, _, h in found),
                        requested=len(pairs), _done=bytearray(len(found)))
        return self._start_prefix(job, kv_cache)

    def hold_prefix(self, hashes, salt: bytes) -> list[int]:
        """Keep the records of the leading stored ``hashes`` from being overwritten until
        :meth:`release_prefix` (say the stored blocks of a preempted sequence, so that its
        swap-out can skip them and its swap-in read them back with ``submit_prefix_read``).
        Returns their tier blocks: the handle to release. Held blocks count as reserved."""
        self._check_open()
        self.prefix.require_enabled()
        return self.prefix.hold(hashes, salt)

    def release_prefix(self, tier_blocks) -> None:
        """End holds taken by :meth:`hold_prefix` (ValueError for a block not held)."""
        self.prefix.release(tier_blocks)

    def _start_prefix(self, job: PrefixJob, kv_cache: torch.Tensor) -> PrefixJob:
        self._track(job)
        if not job.pairs:
            return job
        self.prefix.begin(job)
        pairs, kv, ready = list(job.pairs), copy_view(kv_cache), ready_event(kv_cache)
        self._launch(job, lambda: self.mover.launch_prefix(job.op, kv, pairs, job.salt,
                                                           job.hashes, job._done, ready),
                     IOOrder(job.job_id, job.op, job.pairs, salt=job.salt, hashes=job.hashes))
        return job

    def _merge(self, job, outcomes: list[RankOutcome]) -> None:
        """A prefix job's block is written (read) only where every rank wrote (read) it."""
        super()._merge(job, outcomes)
        if isinstance(job, PrefixJob):
            for outcome in outcomes:
                for i, ok in enumerate(outcome.done):
                    job._done[i] &= ok

    def _on_finished(self, job) -> None:
        if isinstance(job, PrefixJob) and job.pairs:
            self.prefix.finish(job)

    def stalled(self) -> AbstractContextManager:
        share = self.mover.device_share
        return share.stalled() if share is not None else nullcontext()

    def _extra_stats(self) -> dict:
        return self.prefix.stats()
