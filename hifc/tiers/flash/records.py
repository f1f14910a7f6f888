"""Per-block record headers and integrity checks (torch-free).

Every stored FC block carries a 4 KiB header::

    magic "HIFCREC1" | version u16 | reserved u16 | header_crc u32 | epoch u64 | block_id u64
    | seq_id u64 | generation u64 | num_slices u32 | slice_bytes u32 | reserved 8 bytes
    | slice crc32c x num_slices | zero padding to 4096

``header_crc`` is crc32c over the whole 4 KiB page with that field zeroed, so a flipped byte
anywhere in the page is caught. Each slice crc covers the ``slice_bytes`` bytes of one
(layer, K/V) slice of the block; per-slice crcs let slices be checksummed independently, in any
thread. A record is accepted only if magic, version, the cache file's current epoch, the expected
block id, the expected owner (sequence id, generation), the geometry and every crc match;
anything else raises :class:`IntegrityError` naming the mismatch.
"""
from __future__ import annotations

import struct

import crc32c

from hifc.tiers.flash.layout import HEADER_BYTES, MAX_SLICES
from hifc.tiers.jobs import IntegrityError

RECORD_MAGIC = b"HIFCREC1"
RECORD_VERSION = 1
_FIXED = struct.Struct("<8sHHIQQQQII8x")  # 64 bytes
_CRC_FIELD = slice(12, 16)
assert _FIXED.size == 64


def slice_crcs(buffer: memoryview, offsets, length: int) -> list[int]:
    """crc32c of ``length`` bytes at each offset of ``buffer`` (releases the GIL)."""
    return [crc32c.crc32c(buffer[off:off + length]) for off in offsets]


def pack_header(out: memoryview, *, epoch: int, block_id: int, owner: tuple[int, int],
                slice_bytes: int, crcs: list[int]) -> None:
    """Write a complete 4 KiB header page into ``out``."""
    if len(crcs) > MAX_SLICES:
        raise ValueError(f"{len(crcs)} slices exceed the header capacity of {MAX_SLICES}")
    page = bytearray(HEADER_BYTES)
    _FIXED.pack_into(page, 0, RECORD_MAGIC, RECORD_VERSION, 0, 0, epoch, block_id, owner[0],
                     owner[1], len(crcs), slice_bytes)
    struct.pack_into(f"<{len(crcs)}I", page, _FIXED.size, *crcs)
    struct.pack_into("<I", page, _CRC_FIELD.start, crc32c.crc32c(page))
    out[:HEADER_BYTES] = page


def read_header(page: memoryview, block_id: int | None = None) -> dict:
    """Decode a header page after checking its magic and crc (no expectations)."""
    page = bytes(page[:HEADER_BYTES])
    where = "" if block_id is None else f"FC block {block_id}: "
    magic, version, _, stored_crc, epoch, block_id, seq_id, gen, nslices, sbytes = \
        _FIXED.unpack_from(page)
    if magic != RECORD_MAGIC:
        raise IntegrityError(f"{where}bad record magic {magic!r} (never written in this file, or "
                             "overwritten)")
    zeroed = page[:_CRC_FIELD.start] + b"\0\0\0\0" + page[_CRC_FIELD.stop:]
    if crc32c.crc32c(zeroed) != stored_crc:
        raise IntegrityError(f"{where}record header checksum mismatch (torn or corrupted header)")
    if version != RECORD_VERSION:
        raise IntegrityError(f"{where}record version {version} != {RECORD_VERSION}")
    if nslices > MAX_SLICES:
        raise IntegrityError(f"{where}record claims {nslices} slices (max {MAX_SLICES})")
    crcs = list(struct.unpack_from(f"<{nslices}I", page, _FIXED.size))
    return {"epoch": epoch, "block_id": block_id, "owner": (seq_id, gen),
            "num_slices": nslices, "slice_bytes": sbytes, "crcs": crcs}


def verify_header(page: memoryview, *, epoch: int, block_id: int, owner: tuple[int, int],
                  num_slices: int, slice_bytes: int) -> list[int]:
    """Check a header against what the tier expects; returns the stored slice crcs."""
    header = read_header(page, block_id)
    if header["epoch"] != epoch:
        raise IntegrityError(f"stale record for FC block {block_id}: epoch "
                             f"{header['epoch']:#x} is not the cache file's epoch {epoch:#x}")
    if header["block_id"] != block_id:
        raise IntegrityError(f"record holds FC block {header['block_id']}, expected {block_id}")
    if header["owner"] != tuple(owner):
        raise IntegrityError(f"FC block {block_id} belongs to (seq, generation) "
                             f"{header['owner']}, expected {tuple(owner)} (stale record)")
    if header["num_slices"] != num_slices or header["slice_bytes"] != slice_bytes:
        raise IntegrityError(f"FC block {block_id} geometry mismatch: "
                             f"{header['num_slices']}x{header['slice_bytes']} bytes stored, "
                             f"{num_slices}x{slice_bytes} expected")
    return header["crcs"]


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
