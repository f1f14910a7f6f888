"""Rebuild the prefix index of a reopened cache file: one pass over the record headers
(torch-free).

Only the 4 KiB header of each block is read: in the ``layer-kv`` layout the headers are one
contiguous region (large sequential reads), in the ``block-record`` layout one aligned 4 KiB read
per block, spread over ``threads`` threads (the reads release the GIL) on a descriptor of its
own (O_DIRECT where the file system allows it, so a scan neither pollutes nor trusts the page
cache). A header is kept if its magic, version, header crc, block id and geometry are right; its
payload is verified when it is read, as every record is. Of several records of one key the
newest (highest log sequence number) wins; the newest record of any kind says where the append
head resumes. Cost: ``hifc bench init --prefix-scan`` (docs/RESULTS.md).
"""
from __future__ import annotations

import concurrent.futures as cf
import mmap
import os
import time
from dataclasses import dataclass

from hifc.tiers.flash.layout import HEADER_BYTES, Layout
from hifc.tiers.flash.prefix_index import key_of
from hifc.tiers.flash.records import PREFIX, RECORD_MAGIC, read_header
from hifc.tiers.jobs import IntegrityError

BATCH_HEADERS = 256  # headers per read batch: 1 MiB of buffer


@dataclass(frozen=True)
class ScanResult:
    records: list[tuple[int, bytes]]  # (tier block, key) of valid prefix records, oldest first
    next_lsn: int  # 1 + the highest log sequence number found (1 in an empty log)
    head: int  # the block after the newest record of any kind (0 in an empty log)
    headers_read: int
    seconds: float


@dataclass(frozen=True)
class _Found:
    lsn: int
    block: int
    key: bytes | None  # None: not a prefix record


def scan_headers(fd: int, layout: Layout, threads: int = 4) -> ScanResult:
    """Read every block header of the file open on ``fd`` (aligned reads)."""
    start = time.perf_counter()
    batches = range(0, layout.num_blocks, BATCH_HEADERS)
    with cf.ThreadPoolExecutor(max(1, threads), thread_name_prefix="hifc-scan") as pool:
        found = [f for part in pool.map(lambda first: _scan_batch(fd, layout, first), batches)
                 for f in part]
    newest: dict[bytes, _Found] = {}
    for record in found:
        if record.key is not None and (record.key not in newest
                                       or newest[record.key].lsn < record.lsn):
            newest[record.key] = record
    latest = max(found, key=lambda r: r.lsn, default=None)
    records = [(r.block, r.key) for r in sorted(newest.values(), key=lambda r: r.lsn)]
    return ScanResult(records=records, next_lsn=latest.lsn + 1 if latest else 1,
                      head=(latest.block + 1) % layout.num_blocks if latest else 0,
                      headers_read=layout.num_blocks, seconds=time.perf_counter() - start)


def _scan_batch(fd: int, layout: Layout, first: int) -> list[_Found]:
    count = min(BATCH_HEADERS, layout.num_blocks - first)
    view = memoryview(mmap.mmap(-1, count * HEADER_BYTES))  # page aligned, as O_DIRECT wants
    try:
        for block, at, length in _header_runs(layout, first, count):
            _read_fully(fd, view[at:at + length], layout.header_file_offset(block))
    except OSError:
        return []  # unreadable headers index nothing: those records are misses
    found = (_parse(view[i * HEADER_BYTES:(i + 1) * HEADER_BYTES], first + i, layout)
             for i in range(count))
    return [f for f in found if f is not None]


def _header_runs(layout: Layout, first: int, count: int):
    """(block, buffer offset, bytes) of each run of contiguous header pages in the file."""
    runs: list[list[int]] = []
    for i in range(count):
        offset = layout.header_file_offset(first + i)
        if runs and runs[-1][3] == offset:
            runs[-1][2] += HEADER_BYTES
            runs[-1][3] += HEADER_BYTES
        else:
            runs.append([first + i, i * HEADER_BYTES, HEADER_BYTES, offset + HEADER_BYTES])
    return [(block, at, length) for block, at, length, _ in runs]


def _read_fully(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            return  # past the end: the rest stays zero (no record)
        done += n


def _parse(page: memoryview, block: int, layout: Layout) -> _Found | None:
    if page[:len(RECORD_MAGIC)] != RECORD_MAGIC:
        return None  # never written
    try:
        header = read_header(page, block)
    except IntegrityError:
        return None  # torn, corrupted, or an older format
    g = layout.geometry
    if (header.block_id != block or header.num_slices != g.num_slices
            or header.slice_bytes != g.slice_bytes):
        return None
    key = key_of(header.salt, header.block_hash) if header.kind == PREFIX else None
    return _Found(header.lsn, block, key)
