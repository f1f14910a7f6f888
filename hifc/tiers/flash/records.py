"""Per-block record headers and integrity checks (torch-free).

Every stored FC block carries a 4 KiB header::

    magic "HIFCREC1" | version u16 | kind u16 | header_crc u32 | epoch u64 | block_id u64
    | seq_id u64 | generation u64 | num_slices u32 | slice_bytes u32 | lsn u64
    | salt 32 bytes | content hash 32 bytes | slice crc32c x num_slices | zero padding to 4096

``kind`` says what the record holds:

* ``SWAP``: a preempted sequence's block. It belongs to one run (the cache file's ``epoch``) and
  one owner (sequence id, generation); salt and hash are zero.
* ``PREFIX``: a full block of a cached prefix, found by its content hash. It stays valid across
  runs: its ``epoch`` (the run that wrote it) is not checked, its model ``salt`` and ``hash``
  are; the owner is zero.

``lsn`` (log sequence number) counts every record written to the file, across runs: the index
rebuilt at open keeps the newest record of a hash, and the append head resumes after the newest
record of any kind. ``header_crc`` is crc32c over the whole 4 KiB page with that field zeroed, so
a flipped byte anywhere in the page is caught. Each slice crc covers the ``slice_bytes`` bytes of
one (layer, K/V) slice of the block; per-slice crcs let slices be checksummed independently, in
any thread. A record is accepted only if magic, version, kind, the block id, the geometry, the
header crc and every slice crc match, and then the epoch and owner (swap) or the salt and hash
(prefix); anything else raises :class:`IntegrityError` naming the mismatch.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
import numpy as np

from hifc.tiers.flash.layout import HEADER_BYTES, HEADER_FIXED_BYTES, MAX_SLICES
from hifc.tiers.jobs import IntegrityError

RECORD_MAGIC = b"HIFCREC1"
RECORD_VERSION = 2
SWAP = 1
PREFIX = 2
KEY_BYTES = 32  # model salt and content hash
NO_KEY = bytes(KEY_BYTES)
_FIXED = struct.Struct("<8sHHIQQQQIIQ32s32s")
_CRC_FIELD = slice(12, 16)
assert _FIXED.size == HEADER_FIXED_BYTES
# The same fixed part as a numpy record over whole header pages, to check many at once (scan.py);
# ``key`` is salt + hash.
HEADER_DTYPE = np.dtype({
    "names": ["magic", "version", "kind", "header_crc", "epoch", "block_id", "seq_id",
              "generation", "num_slices", "slice_bytes", "lsn", "key"],
    "formats": ["S8", "<u2", "<u2", "<u4", "<u8", "<u8", "<u8", "<u8", "<u4", "<u4", "<u8",
                f"V{2 * KEY_BYTES}"],
    "offsets": [0, 8, 10, 12, 16, 24, 32, 40, 48, 52, 56, 64], "itemsize": HEADER_BYTES})
KEY_FIELD = slice(64, 64 + 2 * KEY_BYTES)


def slice_crcs(buffer: memoryview, offsets, length: int) -> list[int]:
    """crc32c of ``length`` bytes at each offset of ``buffer`` (releases the GIL)."""
    return [crc32c.crc32c(buffer[off:off + length]) for off in offsets]


@dataclass(frozen=True)
class Header:
    kind: int
    epoch: int
    block_id: int
    owner: tuple[int, int]
    num_slices: int
    slice_bytes: int
    lsn: int
    salt: bytes
    block_hash: bytes
    crcs: list[int]


@dataclass(frozen=True)
class SwapStamp:
    """What a chunk's swap records hold (and must hold when read back)."""

    epoch: int
    owner: tuple[int, int]

    def pack(self, out: memoryview, i: int, block_id: int, lsn: int, slice_bytes: int,
             crcs: list[int]) -> None:
        pack_header(out, kind=SWAP, epoch=self.epoch, block_id=block_id, owner=self.owner,
                    lsn=lsn, slice_bytes=slice_bytes, crcs=crcs)

    def verify(self, page: memoryview, i: int, block_id: int, num_slices: int,
               slice_bytes: int) -> list[int]:
        header = _expect_block(page, SWAP, block_id, num_slices, slice_bytes)
        if header.epoch != self.epoch:
            raise IntegrityError(f"stale record for FC block {block_id}: epoch "
                                 f"{header.epoch:#x} is not the cache file's epoch {self.epoch:#x}")
        if header.owner != tuple(self.owner):
            raise IntegrityError(f"FC block {block_id} belongs to (seq, generation) "
                                 f"{header.owner}, expected {tuple(self.owner)} (stale record)")
        return header.crcs


@dataclass(frozen=True)
class PrefixStamp:
    """What a chunk's prefix records hold: block ``i`` of the chunk has ``hashes[i]``."""

    epoch: int  # the run that writes them (informational: never checked)
    salt: bytes
    hashes: tuple[bytes, ...]

    def pack(self, out: memoryview, i: int, block_id: int, lsn: int, slice_bytes: int,
             crcs: list[int]) -> None:
        pack_header(out, kind=PREFIX, epoch=self.epoch, block_id=block_id, lsn=lsn,
                    salt=self.salt, block_hash=self.hashes[i], slice_bytes=slice_bytes,
                    crcs=crcs)

    def verify(self, page: memoryview, i: int, block_id: int, num_slices: int,
               slice_bytes: int) -> list[int]:
        header = _expect_block(page, PREFIX, block_id, num_slices, slice_bytes)
        if header.salt != self.salt:
            raise IntegrityError(f"FC block {block_id} holds a prefix record of another model "
                                 "(salt mismatch)")
        if header.block_hash != self.hashes[i]:
            raise IntegrityError(f"FC block {block_id} holds another prefix block (content hash "
                                 f"{header.block_hash.hex()[:16]}..., expected "
                                 f"{self.hashes[i].hex()[:16]}...)")
        return header.crcs


def pack_header(out: memoryview, *, kind: int, epoch: int, block_id: int, lsn: int,
                slice_bytes: int, crcs: list[int], owner: tuple[int, int] = (0, 0),
                salt: bytes = NO_KEY, block_hash: bytes = NO_KEY) -> None:
    """Write a complete 4 KiB header page into ``out``."""
    if len(crcs) > MAX_SLICES:
        raise ValueError(f"{len(crcs)} slices exceed the header capacity of {MAX_SLICES}")
    page = bytearray(HEADER_BYTES)
    _FIXED.pack_into(page, 0, RECORD_MAGIC, RECORD_VERSION, kind, 0, epoch, block_id, owner[0],
                     owner[1], len(crcs), slice_bytes, lsn, salt, block_hash)
    struct.pack_into(f"<{len(crcs)}I", page, _FIXED.size, *crcs)
    struct.pack_into("<I", page, _CRC_FIELD.start, crc32c.crc32c(page))
    out[:HEADER_BYTES] = page


def read_header(page, block_id: int | None = None) -> Header:
    """Decode a header page after checking its magic, crc and version (no expectations)."""
    page = page[:HEADER_BYTES]
    where = "" if block_id is None else f"FC block {block_id}: "
    (magic, version, kind, _, epoch, stored_id, seq_id, gen, nslices, sbytes, lsn, salt,
     block_hash) = _FIXED.unpack_from(page)
    if magic != RECORD_MAGIC:
        raise IntegrityError(f"{where}bad record magic {magic!r} (never written in this file, or "
                             "overwritten)")
    if not header_crc_ok(page):
        raise IntegrityError(f"{where}record header checksum mismatch (torn or corrupted header)")
    if version != RECORD_VERSION:
        raise IntegrityError(f"{where}record version {version} != {RECORD_VERSION}")
    if nslices > MAX_SLICES:
        raise IntegrityError(f"{where}record claims {nslices} slices (max {MAX_SLICES})")
    crcs = list(struct.unpack_from(f"<{nslices}I", page, _FIXED.size))
    return Header(kind=kind, epoch=epoch, block_id=stored_id, owner=(seq_id, gen),
                  num_slices=nslices, slice_bytes=sbytes, lsn=lsn, salt=salt,
                  block_hash=block_hash, crcs=crcs)


def header_crc_ok(page) -> bool:
    """Whether a header page's stored crc matches the page (crc field taken as zero)."""
    (stored,) = struct.unpack_from("<I", page, _CRC_FIELD.start)
    crc = crc32c.crc32c(b"\0\0\0\0", crc32c.crc32c(page[:_CRC_FIELD.start]))
    return crc32c.crc32c(page[_CRC_FIELD.stop:HEADER_BYTES], crc) == stored


def _expect_block(page, kind: int, block_id: int, num_slices: int,
                  slice_bytes: int) -> Header:
    header = read_header(page, block_id)
    if header.kind != kind:
        names = {SWAP: "swap", PREFIX: "prefix"}
        raise IntegrityError(f"FC block {block_id} holds a {names.get(header.kind, '?')} record, "
                             f"expected a {names[kind]} record")
    if header.block_id != block_id:
        raise IntegrityError(f"record holds FC block {header.block_id}, expected {block_id}")
    if header.num_slices != num_slices or header.slice_bytes != slice_bytes:
        raise IntegrityError(f"FC block {block_id} geometry mismatch: "
                             f"{header.num_slices}x{header.slice_bytes} bytes stored, "
                             f"{num_slices}x{slice_bytes} expected")
    return header


def verify_slices(block_id: int, stored: list[int], computed: list[int], num_layers: int) -> None:
    for index, (want, got) in enumerate(zip(stored, computed)):
        if want != got:
            layer, kind = divmod(index, 2)
            raise IntegrityError(
                f"FC block {block_id} layer {layer} {'KV'[kind]}: payload crc32c {got:#010x} != "
                f"stored {want:#010x} (torn or corrupted data)")
    if len(stored) != len(computed) or len(computed) != 2 * num_layers:
        raise IntegrityError(f"FC block {block_id}: {len(stored)} stored crcs for "
                             f"{len(computed)} slices")
