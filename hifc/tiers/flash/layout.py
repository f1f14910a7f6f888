"""The byte layout of a flash cache file (torch-free).

Two layouts, both with every I/O 4 KiB aligned in offset and length:

``layer-kv`` (the paper's appendix layout)::

    [superblock 4 KiB][headers: N x 4 KiB][L0 K: N slots][L0 V: N slots][L1 K] ... [L(L-1) V]

    offset(l, k, b) = data_base + (2*l + k) * N * slot + b * slot

  A batch of n consecutive FC blocks becomes 2*L data runs of n*slot bytes plus one header run.

``block-record`` (one aligned record per block)::

    [superblock 4 KiB][record 0][record 1] ...      record = [header 4 KiB][L0 K][L0 V] ... [L(L-1) V]

  A batch of n consecutive FC blocks becomes ONE run of n*record bytes.

``slot`` is the paper's block_size_bytes (tokens x KV heads x head dim x itemsize) rounded up to
4 KiB, so blocks whose size is not a multiple of 4 KiB still give aligned I/O (the padding is
never part of a block's data).

A :class:`ChunkPlan` describes how a chunk of n consecutive tier blocks sits in a staging buffer:
which file runs to transfer, where each block header is and the byte strides of the data viewed
as ``[L, 2, n, slice]``. The chunk mover builds tensor views from those numbers, so it never needs to
know which layout is in use.
"""
from __future__ import annotations

from dataclasses import dataclass

from hifc.tiers.geometry import KVGeometry

ALIGN = 4096
SUPERBLOCK_BYTES = ALIGN
HEADER_BYTES = ALIGN

# A record header stores one crc32c (4 bytes) per slice after a 128-byte fixed part (records.py).
HEADER_FIXED_BYTES = 128
MAX_SLICES = (HEADER_BYTES - HEADER_FIXED_BYTES) // 4

LAYER_KV = "layer-kv"
BLOCK_RECORD = "block-record"
LAYOUTS = (LAYER_KV, BLOCK_RECORD)
# Chosen by measurement: see docs/RESULTS.md, "Flash tier I/O (issue 3)".
DEFAULT_LAYOUT = BLOCK_RECORD


def round_up(value: int, align: int = ALIGN) -> int:
    return -(-value // align) * align


@dataclass(frozen=True)
class ChunkPlan:
    """Where a chunk of ``n`` consecutive tier blocks lives in the file and in staging."""

    n: int
    staging_bytes: int
    runs: tuple[tuple[int, int, int], ...]  # (file_offset, staging_offset, length)
    header_offset: int  # staging byte offset of block 0's header
    header_stride: int  # bytes between consecutive headers in staging
    data_offset: int  # staging byte offset of (layer 0, K, block 0)
    data_strides: tuple[int, int, int]  # byte strides of the [L, 2, n] slice grid

    def slice_offset(self, i: int, layer: int, kind: int) -> int:
        s_l, s_k, s_n = self.data_strides
        return self.data_offset + layer * s_l + kind * s_k + i * s_n


class Layout:
    """Byte offsets of every (layer, K/V, block) and block header in a cache file."""

    name = ""

    def __init__(self, geometry: KVGeometry, num_blocks: int):
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if geometry.num_slices > MAX_SLICES:
            raise ValueError(f"{geometry.num_layers} layers exceed the record header capacity "
                             f"({MAX_SLICES // 2} layers)")
        self.geometry = geometry
        self.num_blocks = num_blocks
        self.slot_bytes = round_up(geometry.slice_bytes)

    @property
    def per_block_file_bytes(self) -> int:
        return HEADER_BYTES + self.geometry.num_slices * self.slot_bytes

    @property
    def file_bytes(self) -> int:
        return SUPERBLOCK_BYTES + self.num_blocks * self.per_block_file_bytes

    def staging_bytes(self, n: int) -> int:
        return n * self.per_block_file_bytes

    def _check(self, block: int, n: int = 1) -> None:
        if n <= 0 or block < 0 or block + n > self.num_blocks:
            raise ValueError(f"blocks [{block}, {block + n}) out of range [0, {self.num_blocks})")

    @property
    def header_stride(self) -> int:
        """File bytes from one block's header to the next one's."""
        raise NotImplementedError

    def header_file_offset(self, block: int) -> int:
        raise NotImplementedError

    def data_file_offset(self, layer: int, kind: int, block: int) -> int:
        raise NotImplementedError

    def chunk_plan(self, first_block: int, n: int) -> ChunkPlan:
        raise NotImplementedError


class LayerKVLayout(Layout):
    name = LAYER_KV

    @property
    def data_base(self) -> int:
        return SUPERBLOCK_BYTES + self.num_blocks * HEADER_BYTES

    @property
    def header_stride(self) -> int:
        return HEADER_BYTES

    def header_file_offset(self, block: int) -> int:
        self._check(block)
        return SUPERBLOCK_BYTES + block * HEADER_BYTES

    def data_file_offset(self, layer: int, kind: int, block: int) -> int:
        self._check(block)
        region = 2 * layer + kind
        return self.data_base + region * self.num_blocks * self.slot_bytes + block * self.slot_bytes

    def chunk_plan(self, first_block: int, n: int) -> ChunkPlan:
        self._check(first_block, n)
        run = n * self.slot_bytes
        data_offset = n * HEADER_BYTES
        runs = [(self.header_file_offset(first_block), 0, data_offset)]
        for layer in range(self.geometry.num_layers):
            for kind in (0, 1):
                staging = data_offset + (2 * layer + kind) * run
                runs.append((self.data_file_offset(layer, kind, first_block), staging, run))
        return ChunkPlan(n=n, staging_bytes=self.staging_bytes(n), runs=tuple(runs),
                         header_offset=0, header_stride=HEADER_BYTES, data_offset=data_offset,
                         data_strides=(2 * run, run, self.slot_bytes))


class BlockRecordLayout(Layout):
    name = BLOCK_RECORD

    def record_file_offset(self, block: int) -> int:
        self._check(block)
        return SUPERBLOCK_BYTES + block * self.per_block_file_bytes

    @property
    def header_stride(self) -> int:
        return self.per_block_file_bytes

    def header_file_offset(self, block: int) -> int:
        return self.record_file_offset(block)

    def data_file_offset(self, layer: int, kind: int, block: int) -> int:
        return (self.record_file_offset(block) + HEADER_BYTES
                + (2 * layer + kind) * self.slot_bytes)

    def chunk_plan(self, first_block: int, n: int) -> ChunkPlan:
        self._check(first_block, n)
        rec = self.per_block_file_bytes
        runs = ((self.record_file_offset(first_block), 0, n * rec),)
        return ChunkPlan(n=n, staging_bytes=n * rec, runs=runs, header_offset=0,
                         header_stride=rec, data_offset=HEADER_BYTES,
                         data_strides=(2 * self.slot_bytes, self.slot_bytes, rec))


_LAYOUT_CLASSES = {LAYER_KV: LayerKVLayout, BLOCK_RECORD: BlockRecordLayout}


def make_layout(name: str, geometry: KVGeometry, num_blocks: int) -> Layout:
    try:
        cls = _LAYOUT_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r}; choose one of {list(LAYOUTS)}") from None
    return cls(geometry, num_blocks)


def blocks_for_bytes(layout_name: str, geometry: KVGeometry, size_bytes: int) -> int:
    """How many blocks a cache file of at most ``size_bytes`` holds."""
    per_block = make_layout(layout_name, geometry, 1).per_block_file_bytes
    return max(0, (int(size_bytes) - SUPERBLOCK_BYTES) // per_block)
