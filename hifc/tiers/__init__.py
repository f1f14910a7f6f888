"""Swap tiers: where preempted sequences' KV blocks live (flash cache file or pinned DRAM).

Public API
==========

Build::

    from hifc.tiers import TierConfig, make_tier, geometry_of
    tier = make_tier(TierConfig(kind="flash", path="/nvme/hifc.kvc", size_gib=64,
                                policy="append", layout="block-record", io_threads=8,
                                backend="auto"),          # auto | kvikio | posix
                     geometry_of(kv_cache), device=kv_cache.device)

``TierConfig`` (frozen, validated): ``kind`` flash|dram, ``path``, exactly one of ``size_gib`` /
``num_blocks``, ``policy`` append|left-append, ``layout`` block-record|layer-kv, ``io_threads``
(flash: threads that only issue I/O), ``prep_threads`` (flash: threads that gather, checksum and
scatter; default min(io_threads, cores, 4)), ``backend``, ``chunk_mib`` (largest coalesced I/O),
``direct_io``, ``force`` (overwrite a file that is not an hifc cache file), ``fault_injection``
(tests: ``tier.faults.arm(...)``).

The KV cache is one tensor ``[num_layers, 2, num_blocks, block_size, kv_heads, head_dim]``
(float32/float16/bfloat16, CPU or CUDA); block ``b`` of layer ``l``, kind ``k`` is
``kv_cache[l, k, b]``. Each tier has its own block id space.

``KVTier`` methods (call from one thread; data moves in the tier's worker threads):

* ``can_reserve(n) -> bool`` - never changes state.
* ``reserve(n) -> list[int]`` - tier block ids in policy order (ValueError if fewer are free).
* ``submit_swap_out(kv_cache, pairs, owner) -> Job`` - pairs are (gpu_block, tier_block), the
  tier blocks reserved; ``owner = (seq_id, generation)`` is stamped into every record.
* ``submit_swap_in(kv_cache, pairs, owner) -> Job`` - pairs are (tier_block, gpu_block), the exact
  reverse of a swap-out; records are verified (magic, epoch, block id, owner, crc32c) before a
  byte reaches ``kv_cache``.
* ``swap_out_blocks(kv_cache, gpu_ids, owner) -> Job`` - reserve + submit; a TIER_FULL job when
  there is no room.
* ``poll() -> list[Job]`` - finished jobs, never blocks; ``wait(job, timeout=None) -> Job`` blocks.
  Each job is reported exactly once, by ``poll`` or ``wait``.
* ``free(tier_block_ids)`` - blocks with I/O in flight are freed when it completes (never reused
  before). The caller frees a swap-out's blocks after swap-in, on abort, or when it failed.
* ``stats() -> dict``, ``close()`` (waits for jobs in flight), context manager.
* ``num_blocks``, ``num_free_blocks``; flash only: ``epoch``, ``faults``, ``cache_file``.

``Job`` fields: ``job_id``, ``op`` ("swap_out"/"swap_in"), ``pairs``, ``owner``, ``status``
(JobStatus PENDING/OK/FAILED), ``ok``, ``done``, ``error`` (message), ``error_kind`` (ErrorKind
IO_ERROR, NO_SPACE, SHORT_READ, INTEGRITY, TIER_FULL, BUSY, INTERNAL), ``errno``, ``nbytes``,
``tier_blocks``, ``submitted_at``/``finished_at``/``latency_s``. Errors are reported on jobs,
never raised; only misuse (bad shapes, unreserved ids, repeated ids) raises ValueError at submit.

Engine contract: free GPU blocks only after a swap-out job is OK; on a failed swap-in, recompute.

Modules: ``layout`` (byte offsets), ``allocator`` (FC allocator, torch-free), ``cache_file``
(superblock, epoch, open rules), ``records`` (headers, integrity), ``io_base``/``posix_io``/
``kvikio_io`` (backends), ``faults`` (fault injection), ``staging`` (staging buffers and their
pool), ``pipeline`` (CPU and I/O stages on separate threads), ``swapper`` (a chunk's stages),
``hostcopy`` (CPU KV caches: copies with in-cache checksums), ``tier``
(shared bookkeeping), ``flash``/``dram`` (the two tiers), ``factory`` (config).
"""
from hifc.tiers.allocator import APPEND, LEFT_APPEND, AllocatorStats, FCBlockAllocator
from hifc.tiers.jobs import ErrorKind, Job, JobStatus
from hifc.tiers.layout import BLOCK_RECORD, DEFAULT_LAYOUT, LAYER_KV, KVGeometry
from hifc.tiers.records import IntegrityError

__all__ = [
    "APPEND", "LEFT_APPEND", "AllocatorStats", "FCBlockAllocator", "ErrorKind", "Job",
    "JobStatus", "BLOCK_RECORD", "DEFAULT_LAYOUT", "LAYER_KV", "KVGeometry", "IntegrityError",
    "KVTier", "FlashTier", "DramTier", "TierConfig", "make_tier", "geometry_of",
]


def __getattr__(name):
    # The torch-using classes load lazily so that ``hifc.tiers.allocator`` (and this package)
    # can be imported where torch is unavailable.
    if name in ("TierConfig", "make_tier", "geometry_of"):
        from hifc.tiers import factory
        return {"TierConfig": factory.TierConfig, "make_tier": factory.make_tier,
                "geometry_of": factory.geometry_of}[name]
    if name == "KVTier":
        from hifc.tiers.tier import KVTier
        return KVTier
    if name == "FlashTier":
        from hifc.tiers.flash import FlashTier
        return FlashTier
    if name == "DramTier":
        from hifc.tiers.dram import DramTier
        return DramTier
    raise AttributeError(f"module 'hifc.tiers' has no attribute {name!r}")
