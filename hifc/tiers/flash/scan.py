"""Rebuild the prefix index of a reopened cache file: one pass over the record headers
(torch-free).

Only the 4 KiB header of each block is needed. Headers closer than ``DENSE_STRIDE`` in the file
(the ``layer-kv`` layout keeps them contiguous; small blocks in ``block-record``) are read with
the records between them in large sequential reads; farther apart, with one aligned 4 KiB read
each. Batches of ``BATCH_HEADERS`` run on ``threads`` threads (the reads release the GIL) on a
descriptor of their own (O_DIRECT where the file system allows it, so a scan neither pollutes
nor trusts the page cache). A header is kept if its magic, version, block id, geometry and header
crc are right (the fixed fields of a batch are checked at once with numpy, then the crc of each
candidate); its payload is verified when it is read, as every record is. Of several records of
one key the newest (highest log sequence number) wins; the newest record of any kind says where
the append head resumes. Cost: ``hifc bench init --prefix-scan``.
"""
from __future__ import annotations

import concurrent.futures as cf
import mmap
import os
import time
from dataclasses import dataclass

import numpy as np

from hifc.tiers.flash.layout import HEADER_BYTES, Layout
from hifc.tiers.flash.records import (
    HEADER_DTYPE, KEY_FIELD, PREFIX, RECORD_MAGIC, RECORD_VERSION, header_crc_ok,
)

BATCH_HEADERS = 64  # headers per batch: batches run in parallel
DENSE_STRIDE = 64 << 10  # headers at most this far apart are read with what lies between


@dataclass(frozen=True)
class ScanResult:
    records: list[tuple[int, bytes]]  # (tier block, key) of valid prefix records, oldest first
    next_lsn: int  # 1 + the highest log sequence number found (1 in an empty log)
    head: int  # the block after the newest record of any kind (0 in an empty log)
    headers_read: int
    seconds: float


Found = tuple[int, int, bytes | None]  # (lsn, tier block, key; None: not a prefix record)


def scan_headers(fd: int, layout: Layout, threads: int = 4) -> ScanResult:
    """Read every block header of the file open on ``fd`` (aligned reads)."""
    start = time.perf_counter()
    batches = range(0, layout.num_blocks, BATCH_HEADERS)
    with cf.ThreadPoolExecutor(max(1, threads), thread_name_prefix="hifc-scan") as pool:
        found = [f for part in pool.map(lambda first: _scan_batch(fd, layout, first), batches)
                 for f in part]
    newest: dict[bytes, Found] = {}
    for record in found:
        key = record[2]
        if key is not None and (key not in newest or newest[key][0] < record[0]):
            newest[key] = record
    latest = max(found, default=None)
    records = [(block, key) for _, block, key in sorted(newest.values())]
    return ScanResult(records=records, next_lsn=latest[0] + 1 if latest else 1,
                      head=(latest[1] + 1) % layout.num_blocks if latest else 0,
                      headers_read=layout.num_blocks, seconds=time.perf_counter() - start)


def _scan_batch(fd: int, layout: Layout, first: int) -> list[Found]:
    count = min(BATCH_HEADERS, layout.num_blocks - first)
    dense = layout.header_stride <= DENSE_STRIDE
    stride = layout.header_stride if dense else HEADER_BYTES  # of the pages in the buffer
    view = memoryview(mmap.mmap(-1, (count - 1) * stride + HEADER_BYTES))  # page aligned
    try:
        if dense:
            _read_fully(fd, view, layout.header_file_offset(first))
        else:
            for i in range(count):
                _read_fully(fd, view[i * stride:i * stride + HEADER_BYTES],
                            layout.header_file_offset(first + i))
    except OSError:
        return []  # unreadable headers index nothing: those records are misses
    return _parse(view, stride, first, count, layout)


def _read_fully(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            return  # past the end: the rest stays zero (no record)
        done += n


def _parse(view: memoryview, stride: int, first: int, count: int,
           layout: Layout) -> list[Found]:
    """The valid records among ``count`` header pages ``stride`` bytes apart in ``view``, of
    blocks ``first...``: the fixed fields of all checked at once, then each candidate's crc."""
    g = layout.geometry
    headers = np.ndarray((count,), HEADER_DTYPE, view, strides=(stride,))
    candidates = np.flatnonzero(
        (headers["magic"] == RECORD_MAGIC) & (headers["version"] == RECORD_VERSION)
        & (headers["block_id"] == np.arange(first, first + count, dtype=np.uint64))
        & (headers["num_slices"] == g.num_slices) & (headers["slice_bytes"] == g.slice_bytes))
    kinds, lsns = headers["kind"].tolist(), headers["lsn"].tolist()
    found = []
    for i in candidates.tolist():
        page = view[i * stride:i * stride + HEADER_BYTES]
        if header_crc_ok(page):  # else torn or corrupted: not indexed
            found.append((lsns[i], first + i, bytes(page[KEY_FIELD]) if kinds[i] == PREFIX
                          else None))
    return found
