"""``TierConfig``: where preempted sequences' KV goes, and how (torch-free).

Each option is declared once here, with the name users give it (``LLM(kv_offload="flash",
flash_path=...)``, ``--flash-path``); the engine, ``make_tier`` and the command line all read
this one object.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from hifc.options import check_choice, check_size_gib, option
from hifc.tiers.allocator import POLICIES
from hifc.tiers.flash.layout import DEFAULT_LAYOUT, LAYOUTS

KV_OFFLOAD = ("none", "dram", "flash")
FLASH_BACKENDS = ("auto", "kvikio", "posix")
PREFIX_STORE = ("off", "evicted", "all")
PREFIX_STORE_READ = ("auto", "always")
MAX_THREADS = 256
MAX_FLUSH_SECONDS = 3600
# host staging: a victim of up to ~1 GiB (8B Llama ~8k tokens, 14B Qwen ~5k) is staged at PCIe
# speed (~50 ms) instead of waiting ~0.6 s for the disk; pinned host memory is plentiful next
# to a GPU, and a power of two wastes nothing of torch's pinned allocator's rounding
DEFAULT_STAGING_MIB = 1024
MAX_STAGING_MIB = 1 << 20


@dataclass(frozen=True)
class TierConfig:
    """KV swap tier."""

    kv_offload: str = option(
        "none", "where preempted sequences' KV goes: nowhere (recompute), pinned DRAM, or a "
        "flash cache file", choices=KV_OFFLOAD)
    flash_path: str | None = option(
        None, "flash tier cache file (created preallocated, mode 0600)")
    flash_size_gib: float | None = option(None, "flash tier size in GiB")
    swap_space: float | None = option(
        None, "pinned DRAM tier size in GiB (--kv-offload dram; vLLM's name)")
    num_tier_blocks: int | None = option(
        None, "tier size in blocks, instead of --flash-size-gib / --swap-space", cli=False)
    flash_policy: str = option(
        "append", "flash block allocation: append (a sequential log) or left-append (lowest "
        "free block)", choices=POLICIES)
    flash_layout: str = option(
        DEFAULT_LAYOUT, "byte layout of the cache file: one record per block, or the paper's "
        "layer-by-layer regions", choices=LAYOUTS)
    flash_io_threads: int = option(8, "threads that only issue flash I/O (the queue depth)")
    flash_prep_threads: int | None = option(
        None, "threads that gather, checksum and scatter flash chunks (default: "
        "min(io threads, cores, 4))")
    flash_backend: str = option(
        "auto", "flash I/O: kvikio (cuFile) or posix O_DIRECT; auto: kvikio where GPUDirect "
        "Storage works, else posix", choices=FLASH_BACKENDS)
    flash_chunk_mib: int = option(32, "largest coalesced flash I/O in MiB")
    flash_staging_mib: int = option(
        DEFAULT_STAGING_MIB, "host memory (pinned for GPU caches) in MiB where flash swap-outs "
        "are staged: a victim's GPU blocks are freed as soon as it holds their bytes, so a "
        "victim up to this size is freed at copy speed, not at the disk's (at least one chunk "
        "per I/O and prep thread; GPU staging stays one chunk per prep thread)")
    flash_direct_io: bool = option(
        True, "ask for O_DIRECT (falls back to buffered I/O where the file system refuses)")
    prefix_store: str = option(
        "evicted", "flash prefix store (kv_offload flash): full cached blocks kept in the cache "
        "file by content hash, found again after GPU eviction and across restarts; written "
        "when the GPU evicts them, for every full block, or never", choices=PREFIX_STORE)
    prefix_store_read: str = option(
        "auto", "read blocks found in the flash prefix store, or recompute them: auto decides "
        "per request from the measured tier read bandwidth and prefill speed; always reads",
        choices=PREFIX_STORE_READ)
    prefix_store_flush_seconds: float = option(
        5.0, "at a clean shutdown, the most seconds spent writing the cached GPU blocks that "
        "the flash prefix store lacks (0: none)")
    flash_force: bool = option(
        False, "reinitialise an existing file that is not an hifc cache file", cli=False)
    tier_fault_injection: bool = option(
        False, "tests: expose tier.faults to inject I/O faults", cli=False)

    def __post_init__(self) -> None:
        check_choice("kv_offload", self.kv_offload, KV_OFFLOAD)
        check_choice("flash_policy", self.flash_policy, POLICIES)
        check_choice("flash_layout", self.flash_layout, LAYOUTS)
        check_choice("flash_backend", self.flash_backend, FLASH_BACKENDS)
        check_choice("prefix_store", self.prefix_store, PREFIX_STORE)
        check_choice("prefix_store_read", self.prefix_store_read, PREFIX_STORE_READ)
        flush = self.prefix_store_flush_seconds
        if isinstance(flush, bool) or not isinstance(flush, (int, float)) \
                or not 0 <= flush <= MAX_FLUSH_SECONDS:  # also false for nan
            raise ValueError(f"prefix_store_flush_seconds must be a number of seconds in "
                             f"[0, {MAX_FLUSH_SECONDS}], got {flush!r}")
        _int_in("flash_io_threads", self.flash_io_threads, 1, MAX_THREADS)
        if self.flash_prep_threads is not None:
            _int_in("flash_prep_threads", self.flash_prep_threads, 1, MAX_THREADS)
        _int_in("flash_chunk_mib", self.flash_chunk_mib, 1, 1024)
        _int_in("flash_staging_mib", self.flash_staging_mib, 1, MAX_STAGING_MIB)
        for name in ("flash_size_gib", "swap_space"):
            if getattr(self, name) is not None:
                check_size_gib(name, getattr(self, name))
        if self.flash_path is not None:
            if not isinstance(self.flash_path, (str, os.PathLike)):
                raise ValueError(f"flash_path must be a path, got "
                                 f"{type(self.flash_path).__name__}")
            object.__setattr__(self, "flash_path", os.fspath(self.flash_path))
        if self.num_tier_blocks is not None:
            _int_in("num_tier_blocks", self.num_tier_blocks, 1, 1 << 62)
        for name in ("flash_direct_io", "flash_force", "tier_fault_injection"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.kv_offload == "flash":
            if not self.flash_path:
                raise ValueError("kv_offload='flash' needs flash_path (the cache file to create)")
            self._one_size("flash_size_gib")
        elif self.kv_offload == "dram":
            self._one_size("swap_space")

    def _one_size(self, size_option: str) -> None:
        if (getattr(self, size_option) is None) == (self.num_tier_blocks is None):
            raise ValueError(f"kv_offload={self.kv_offload!r} needs exactly one of "
                             f"{size_option} and num_tier_blocks")

    @property
    def enabled(self) -> bool:
        return self.kv_offload != "none"

    @property
    def stores_prefixes(self) -> bool:
        """Whether the tier keeps a prefix store (a flash tier with prefix_store not off)."""
        return self.kv_offload == "flash" and self.prefix_store != "off"

    @property
    def size_gib(self) -> float | None:
        """The size asked for in GiB (None when given in blocks or no tier)."""
        return {"flash": self.flash_size_gib, "dram": self.swap_space}.get(self.kv_offload)


def _int_in(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
