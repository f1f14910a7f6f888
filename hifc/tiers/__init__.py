"""Swap tiers: where preempted sequences' KV blocks live (flash cache file or pinned DRAM).

The contract
============

Build::

    from hifc.tiers import TierConfig, make_tier, geometry_of
    tier = make_tier(TierConfig(kv_offload="flash", flash_path="/nvme/hifc.kvc",
                                flash_size_gib=64),
                     geometry_of(kv_cache), device=kv_cache.device)

``TierConfig`` (:mod:`hifc.tiers.config`, frozen, validated once) holds every tier option under
the name users give it: ``kv_offload`` none|dram|flash, ``flash_path``, ``flash_size_gib`` /
``swap_space`` (or ``num_tier_blocks``), ``flash_policy`` append|left-append, ``flash_layout``
block-record|layer-kv, ``flash_io_threads``, ``flash_prep_threads``, ``flash_backend``
auto|kvikio|posix, ``flash_chunk_mib``, ``flash_staging_mib``, ``flash_direct_io``, ``prefix_store`` off|evicted|all,
``flash_force``, ``tier_fault_injection`` (tests: ``tier.faults.arm(...)``).

The KV cache is one tensor ``[num_layers, 2, num_blocks, block_size, kv_heads, head_dim]``
(float32/float16/bfloat16, CPU or CUDA); block ``b`` of layer ``l``, kind ``k`` is
``kv_cache[l, k, b]``. Each tier has its own block id space.

``KVTier`` methods (:mod:`hifc.tiers.tier`; call from one thread, data moves in the tier's
worker threads):

* ``can_reserve(n) -> bool`` - never changes state.
* ``reserve(n) -> list[int]`` - tier block ids in policy order (ValueError if fewer are free).
* ``submit_swap_out(kv_cache, pairs, owner) -> Job`` - pairs are (gpu_block, tier_block), the
  tier blocks reserved; ``owner = (seq_id, generation)`` is stamped into every record.
* ``submit_swap_in(kv_cache, pairs, owner) -> Job`` - pairs are (tier_block, gpu_block), the exact
  reverse of a swap-out; records are verified before a byte reaches ``kv_cache``.
* ``swap_out_blocks(kv_cache, gpu_ids, owner) -> Job`` - reserve + submit; a TIER_FULL job when
  there is no room.
* ``poll() -> list[Job]`` - finished jobs, never blocks; ``wait(job, timeout=None) -> Job`` blocks.
  Each job is reported exactly once, by ``poll`` or ``wait``.
* ``free(tier_block_ids)`` - blocks with I/O in flight are freed when it completes (never reused
  before). The caller frees a swap-out's blocks after swap-in, on abort, or when it failed.
* ``stats() -> dict``, ``close()`` (waits for jobs in flight), context manager.
* ``num_blocks``, ``num_free_blocks``; flash only: ``epoch``, ``faults``, ``cache_file``.

Block space and movers: a ``KVTier`` is the block space (allocator, reservations, pins, the
prefix index, jobs); the data moves in a ``TierMover`` (:mod:`hifc.tiers.mover`: staging, I/O,
checksums; ``FlashMover``, ``DramMover``). With tensor parallelism every rank has a mover of its
own (its own file or pool, for its shard of the KV heads), the engine's tier is rank 0's and
drives the others through ``peers`` (``make_tier(..., peers=...)``); the other ranks run the
same ``IOOrder`` on theirs (:mod:`hifc.tiers.rank_jobs`), and a job ends when every rank's part
did (failed if any part failed). ``geometry`` is one rank's block shape; ``tier.block_bytes``
counts every rank's.

The flash prefix store (flash only, unless ``prefix_store="off"``; :mod:`hifc.tiers.flash.prefix_store`):
full KV blocks kept in the same log by 32-byte content hash under a 32-byte model salt, found
again after GPU eviction and across restarts (swap records stay per run).

* ``lookup_prefix(hashes, salt, count=True) -> int`` - how many leading hashes are stored;
  changes nothing stored (counts the query in ``stats()`` unless ``count`` is False).
* ``submit_prefix_write(kv_cache, [(gpu_block, hash)], salt) -> PrefixJob`` - skips hashes stored
  or being written, and what does not fit; completion publishes what was written.
* ``submit_prefix_read(kv_cache, [(hash, gpu_block)], salt) -> PrefixJob`` - the leading stored
  hashes; each record verified (kind, salt, hash, block id, crcs) before it reaches the cache; one
  that fails is dropped (a miss) and fails the job. Either way the first ``job.blocks_ok`` blocks
  hold the stored KV.
* ``hold_prefix(hashes, salt) -> list[int]`` / ``release_prefix(tier_blocks)`` - keep the leading
  stored records from being overwritten meanwhile (a preempted sequence's stored blocks).
* Prefix records never hold up a reservation: the append head overwrites the oldest as it comes
  round (left-append reclaims the oldest when free blocks run out), skipping those being read.

``Job`` (:mod:`hifc.tiers.jobs`) fields: ``job_id``, ``op`` ("swap_out"/"swap_in", and
"prefix_write"/"prefix_read" for a ``PrefixJob``), ``pairs``,
``owner``, ``status`` (JobStatus PENDING/OK/FAILED), ``ok``, ``done``, ``error`` (message),
``error_kind`` (ErrorKind IO_ERROR, NO_SPACE, SHORT_READ, INTEGRITY, TIER_FULL, BUSY, INTERNAL,
CANCELLED),
``errno``, ``nbytes``, ``tier_blocks``, ``submitted_at``/``finished_at``/``latency_s``. Errors are
reported on jobs, never raised; only misuse (bad shapes, unreserved ids, repeated ids) raises
ValueError at submit.

Engine contract: free GPU blocks only after a swap-out job is OK; on a failed swap-in, recompute.

Modules at this level: ``config``, ``geometry`` (block shape, torch-free), ``allocator`` (FC block
allocator, torch-free), ``jobs``, ``tier`` (the base class: shared bookkeeping), ``mover`` (the
worker side), ``rank_jobs`` (a worker rank's jobs), ``dram`` (the pinned-DRAM tier),
``factory`` (``make_tier``, ``make_mover``). The flash tier's internals are the sub-package
:mod:`hifc.tiers.flash`.
"""
from hifc.tiers.allocator import APPEND, LEFT_APPEND, AllocatorStats, FCBlockAllocator
from hifc.tiers.config import TierConfig
from hifc.tiers.geometry import KVGeometry
from hifc.tiers.jobs import ErrorKind, IntegrityError, Job, JobStatus, PrefixJob

__all__ = [
    "APPEND", "LEFT_APPEND", "AllocatorStats", "FCBlockAllocator", "ErrorKind", "Job",
    "JobStatus", "PrefixJob", "KVGeometry", "IntegrityError", "KVTier", "FlashTier", "DramTier",
    "TierConfig", "make_tier", "geometry_of",
]


def __getattr__(name):
    # The torch-using classes load lazily so that ``hifc.tiers.allocator``, the config and the
    # geometry (and this package) can be imported where torch is unavailable.
    if name in ("make_tier", "geometry_of"):
        from hifc.tiers import factory
        return {"make_tier": factory.make_tier, "geometry_of": factory.geometry_of}[name]
    if name == "KVTier":
        from hifc.tiers.tier import KVTier
        return KVTier
    if name == "FlashTier":
        from hifc.tiers.flash.tier import FlashTier
        return FlashTier
    if name == "DramTier":
        from hifc.tiers.dram import DramTier
        return DramTier
    raise AttributeError(f"module 'hifc.tiers' has no attribute {name!r}")
