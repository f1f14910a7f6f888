"""A page-mapped flash translation layer with greedy garbage collection, for WAF estimates.

Model: `logical_pages` host-visible pages; physical space is that plus `over_provisioning`,
rounded up to whole erase blocks of `pages_per_erase_block` pages. One write frontier (host and
GC writes share the open erase block). When the open block is full and at most one free block is
left, greedy GC erases the closed block with the fewest valid pages after copying its valid pages
to the frontier. There is no TRIM: a logical page stays valid until it is overwritten, as for a
cache file whose freed blocks are simply reused. `precondition` first fills the whole logical
space sequentially (not counted), so the drive starts in steady state like a pre-created file.

    WAF = NAND page writes (host + GC copies) / host page writes

The core works on runs of logical pages with numpy (one slice per erase block touched), so a
million page writes replay in well under a second; greedy victim choice is one argmin over a
per-block key (valid pages, plus a large offset for blocks that are free, open or being
collected, which keeps them out of the choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_SPARE_ERASE_BLOCKS = 3  # with <= 1 free and 1 open, a victim with an invalid page must exist


@dataclass(frozen=True)
class FtlConfig:
    logical_pages: int
    pages_per_erase_block: int = 256
    over_provisioning: float = 0.07
    precondition: bool = True

    def __post_init__(self) -> None:
        if self.logical_pages <= 0:
            raise ValueError(f"logical_pages must be > 0, got {self.logical_pages}")
        if self.pages_per_erase_block <= 0:
            raise ValueError(f"pages_per_erase_block must be > 0, got "
                             f"{self.pages_per_erase_block}")
        if self.over_provisioning < 0:
            raise ValueError(f"over_provisioning must be >= 0, got {self.over_provisioning}")
        spare = self.num_erase_blocks - math.ceil(self.logical_pages / self.pages_per_erase_block)
        if spare < MIN_SPARE_ERASE_BLOCKS:
            raise ValueError(
                f"over-provisioning {self.over_provisioning:g} of {self.logical_pages} pages "
                f"leaves {spare} spare erase blocks of {self.pages_per_erase_block} pages; "
                f"greedy GC needs at least {MIN_SPARE_ERASE_BLOCKS} (more over-provisioning, "
                "more capacity or smaller erase blocks)")

    @property
    def num_erase_blocks(self) -> int:
        physical = self.logical_pages * (1 + self.over_provisioning)
        return math.ceil(round(physical, 6) / self.pages_per_erase_block)


@dataclass(frozen=True)
class FtlStats:
    host_page_writes: int
    nand_page_writes: int
    gc_count: int             # erase blocks collected (= erases after preconditioning)
    gc_relocated_pages: int

    @property
    def waf(self) -> float:
        if self.host_page_writes == 0:
            raise ValueError("no host writes: WAF is undefined")
        return self.nand_page_writes / self.host_page_writes


class PageMappedFtl:
    """Mutable simulator state; feed it logical page runs with `write`, read `stats()`."""

    def __init__(self, config: FtlConfig) -> None:
        self.config = config
        ppb, num_blocks = config.pages_per_erase_block, config.num_erase_blocks
        self._ppb = ppb
        self._big = 2 * ppb + 1                                   # > any valid count
        self._l2p = np.full(config.logical_pages, -1, dtype=np.int64)
        self._p2l = np.full(num_blocks * ppb, -1, dtype=np.int64)
        self._key = np.full(num_blocks, self._big, dtype=np.int64)  # valid (+big unless closed)
        self._free = list(range(num_blocks - 1, 0, -1))          # pop() hands out low ids first
        self._open, self._wp = 0, 0
        self._in_gc = False
        self._host = self._nand = self._gcs = self._relocated = 0
        if config.precondition:
            self.write(np.arange(config.logical_pages, dtype=np.int64))
            self._host = self._nand = self._gcs = self._relocated = 0

    def stats(self) -> FtlStats:
        return FtlStats(self._host, self._nand, self._gcs, self._relocated)

    def write(self, lpns: np.ndarray) -> None:
        """Host-write the logical pages `lpns` in order. Pages in one call must be distinct."""
        lpns = np.asarray(lpns, dtype=np.int64)
        if lpns.size and (lpns.min() < 0 or lpns.max() >= self.config.logical_pages):
            raise ValueError(f"logical page out of range [0, {self.config.logical_pages})")
        self._host += lpns.size
        self._program(lpns)

    def _program(self, lpns: np.ndarray) -> None:
        ppb, l2p, p2l, key = self._ppb, self._l2p, self._p2l, self._key
        done = 0
        while done < lpns.size:
            if self._wp == ppb:
                self._open_next_block()
            count = min(ppb - self._wp, lpns.size - done)
            chunk = lpns[done:done + count]
            old = l2p[chunk]
            old = old[old >= 0]
            if old.size:
                p2l[old] = -1
                np.subtract.at(key, old // ppb, 1)
            phys = np.arange(count, dtype=np.int64) + (self._open * ppb + self._wp)
            l2p[chunk] = phys
            p2l[phys] = chunk
            key[self._open] += count
            self._wp += count
            self._nand += count
            done += count

    def _open_next_block(self) -> None:
        if not self._in_gc:
            while len(self._free) <= 1:
                self._collect()
        self._key[self._open] -= self._big                       # the full block closes
        self._open, self._wp = self._free.pop(), 0

    def _collect(self) -> None:
        ppb, key = self._ppb, self._key
        victim = int(np.argmin(key))
        if key[victim] >= ppb:
            raise RuntimeError("no erase block with invalid pages to collect")
        key[victim] += self._big                                  # out of the victim choice
        start = victim * ppb
        valid = self._p2l[start:start + ppb]
        valid = valid[valid >= 0].copy()
        self._in_gc = True
        try:
            self._program(valid)
        finally:
            self._in_gc = False
        assert key[victim] == self._big, "victim still holds valid pages"
        self._relocated += valid.size
        self._gcs += 1
        self._free.append(victim)


def simulate(config: FtlConfig, writes: list[np.ndarray]) -> FtlStats:
    """Replay host writes, each an array of distinct logical pages, in order."""
    ftl = PageMappedFtl(config)
    for lpns in writes:
        ftl.write(lpns)
    return ftl.stats()
