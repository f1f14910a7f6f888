"""The flash prefix store: full KV blocks kept in the cache file by content hash, so that a block
the GPU evicted can be read back instead of recomputed, in this run or a later one.

:class:`~hifc.tiers.flash.tier.FlashTier` owns one (``tier.prefix``) and exposes it as
``lookup_prefix``, ``submit_prefix_write`` and ``submit_prefix_read``; this module holds the
bookkeeping those share: which blocks of a request to write or read, what a finished job
publishes, drops or unpins (through the :class:`~hifc.tiers.flash.prefix_index.PrefixIndex`),
the bound on writes in flight, and the statistics. (The I/O, and its cancellation at close, is
the mover's: :mod:`hifc.tiers.flash.mover`.)

Prefix records live in the same append log as swap records (:mod:`hifc.tiers.flash.records`,
kind ``PREFIX``); they survive restarts (``hifc.tiers.flash.scan`` rebuilds the index when the
file is reopened) and are overwritten, oldest first, as the log comes round. Hashes and the model
salt are opaque 32-byte strings; a record is found only under the salt it was written with.
"""
from __future__ import annotations

from collections import Counter

from hifc.tiers.flash.mover import PREFIX_WRITE
from hifc.tiers.flash.prefix_index import PrefixIndex, key_of
from hifc.tiers.flash.records import KEY_BYTES
from hifc.tiers.flash.scan import ScanResult
from hifc.tiers.jobs import PrefixJob

PREFIX_READ = "prefix_read"
WRITE_LIMIT_CHUNKS = 4  # per chunk the pipeline runs at once: prefix-write chunks queued


def check_key(name: str, value) -> bytes:
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        raise ValueError(f"{name} must be {KEY_BYTES} bytes, got {value!r:.80}")
    return value


def _int_id(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"KV cache block ids must be ints, got {value!r}")
    return value


def check_write_pairs(pairs) -> list[tuple[int, bytes]]:
    """``(gpu_block, block_hash)`` pairs, validated."""
    out = []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"prefix write pairs must be (gpu_block, block_hash), got {pair!r:.80}")
        out.append((_int_id(pair[0]), check_key("block_hash", pair[1])))
    return out


def check_read_pairs(pairs) -> list[tuple[bytes, int]]:
    """``(block_hash, gpu_block)`` pairs, validated; no hash twice."""
    out = []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"prefix read pairs must be (block_hash, gpu_block), got {pair!r:.80}")
        out.append((check_key("block_hash", pair[0]), _int_id(pair[1])))
    if len({h for h, _ in out}) != len(out):
        raise ValueError("prefix read pairs repeat a block hash")
    return out


class PrefixStore:
    """``block_bytes``: KV bytes of one stored block (every rank's shard); ``block_size``:
    its tokens."""

    def __init__(self, index: PrefixIndex, block_bytes: int, block_size: int, *,
                 enabled: bool, write_limit: int, scan: ScanResult | None = None):
        self.index = index
        self.block_bytes = block_bytes
        self.block_size = block_size
        self.enabled = enabled
        self.write_limit = write_limit  # prefix-write blocks in flight at most
        self.scan = scan  # how the index was rebuilt at open (None: a new file, or off)
        self._writes_in_flight = 0
        self._held: Counter[int] = Counter()  # tier block -> holds not released
        self._counts: Counter[str] = Counter()

    def require_enabled(self) -> None:
        if not self.enabled:
            raise ValueError("the flash prefix store is off (prefix_store='off')")

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, hashes, salt: bytes, count: bool = True) -> int:
        """How many leading ``hashes`` (a chain of full blocks) have a readable record under
        ``salt``. Changes nothing stored; counts the query and its hits (in tokens) unless
        ``count`` is False."""
        check_key("salt", salt)
        hashes = [check_key("block_hash", h) for h in hashes]
        found = self.index.leading_hits(salt, hashes) if self.enabled else 0
        if count:
            self._counts["queries"] += len(hashes) * self.block_size
            self._counts["hits"] += found * self.block_size
        return found

    # -- what a job covers -------------------------------------------------------------------
    def select_writes(self, pairs: list[tuple[int, bytes]], salt: bytes,
                      room: int) -> list[tuple[int, bytes]]:
        """The pairs to write, in order: hashes neither stored nor being written (each once;
        the others are *deduplicated*), as many as ``room`` tier blocks and the bound on writes
        in flight allow (the rest are *dropped*: a cache may decline)."""
        new, seen = [], set()
        for gpu_block, block_hash in pairs:
            key = key_of(salt, block_hash)
            if key not in seen and key not in self.index and not self.index.is_writing(key):
                seen.add(key)
                new.append((gpu_block, block_hash))
        limit = max(0, min(room, self.write_limit - self._writes_in_flight))
        self._counts["write_dedups"] += len(pairs) - len(new)
        self._counts["write_drops"] += max(0, len(new) - limit)
        return new[:limit]

    def select_reads(self, pairs: list[tuple[bytes, int]],
                     salt: bytes) -> list[tuple[int, int, bytes]]:
        """(tier block, gpu block, hash) of the leading pairs whose hash is stored now."""
        out = []
        for block_hash, gpu_block in pairs:
            block = self.index.block_of(key_of(salt, block_hash))
            if block is None:
                break
            out.append((block, gpu_block, block_hash))
        return out

    # -- holds -------------------------------------------------------------------------------
    def hold(self, hashes, salt: bytes) -> list[int]:
        """Pin the records of the leading stored ``hashes``; their tier blocks are the handle."""
        check_key("salt", salt)
        blocks = [block for block, _, _ in
                  self.select_reads([(check_key("block_hash", h), 0) for h in hashes], salt)]
        for block in blocks:
            self.index.pin(block)
            self._held[block] += 1
        return blocks

    def release(self, blocks) -> None:
        blocks = list(blocks)
        need = Counter(blocks)
        for block, count in need.items():
            if self._held[block] < count:
                raise ValueError(f"tier block {block!r} is not held")
        for block in blocks:
            self._held[block] -= 1
            if not self._held[block]:
                del self._held[block]
            self.index.unpin(block)

    # -- job life ----------------------------------------------------------------------------
    def begin(self, job: PrefixJob) -> None:
        """Hold what ``job`` needs until :meth:`finish`: its write blocks, or its read pins."""
        if job.op == PREFIX_WRITE:
            for (_, block), block_hash in zip(job.pairs, job.hashes):
                self.index.begin_write(key_of(job.salt, block_hash), block)
            self._writes_in_flight += len(job.pairs)
        else:
            for block, _ in job.pairs:
                self.index.pin(block)

    def finish(self, job: PrefixJob) -> None:
        """``job`` ended: publish what it wrote, or drop the records it could not read (each
        becomes a miss), and release its blocks."""
        done = job._done
        block_bytes = self.block_bytes
        if job.op == PREFIX_WRITE:
            for i, block_hash in enumerate(job.hashes):
                self.index.end_write(key_of(job.salt, block_hash), ok=bool(done[i]))
            self._writes_in_flight -= len(job.pairs)
            job.blocks_ok = sum(done)
            self._counts["bytes_written"] += job.blocks_ok * block_bytes
            self._counts["blocks_written"] += job.blocks_ok
            return
        for i, (block, _) in enumerate(job.pairs):
            if not done[i]:
                self.index.drop(block)
                self._counts["records_dropped"] += 1
            self.index.unpin(block)
        job.blocks_ok = next((i for i, ok in enumerate(done) if not ok), len(done))
        self._counts["bytes_read"] += sum(done) * block_bytes
        self._counts["blocks_read"] += sum(done)

    def stats(self) -> dict:
        c = self._counts
        out = {"prefix_store_enabled": self.enabled,
               "prefix_store_queries": c["queries"], "prefix_store_hits": c["hits"],
               "prefix_store_bytes_read": c["bytes_read"],
               "prefix_store_bytes_written": c["bytes_written"],
               "prefix_store_blocks": len(self.index),
               "prefix_store_blocks_read": c["blocks_read"],
               "prefix_store_blocks_written": c["blocks_written"],
               "prefix_store_write_dedups": c["write_dedups"],
               "prefix_store_write_drops": c["write_drops"],
               "prefix_store_records_dropped": c["records_dropped"],
               "prefix_store_pinned_blocks": self.index.num_pinned,
               "prefix_store_held_blocks": len(self._held)}
        if self.scan is not None:
            out["prefix_store_scan_seconds"] = self.scan.seconds
            out["prefix_store_scan_records"] = len(self.scan.records)
        return out

