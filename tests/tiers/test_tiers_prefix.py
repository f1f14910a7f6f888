"""The flash prefix store: blocks kept by content hash in the swap log, across restarts."""
import hashlib
import os
import random
import struct
import subprocess
import sys
import textwrap

import crc32c
import pytest
import torch

from hifc.analysis.swaptrace import load_trace
from hifc.analysis.wafsim import WafSimConfig, replay
from hifc.tiers import ErrorKind, JobStatus, KVGeometry, TierConfig
from hifc.tiers.flash.layout import HEADER_BYTES, LAYOUTS
from tests.tiers.tier_helpers import SMALL, flip_byte, gated, random_kv, same_bytes

SALT = hashlib.sha256(b"model A").digest()
OTHER_SALT = hashlib.sha256(b"model B").digest()
POLICIES = ("append", "left-append")


def chain(n, start=0, tag="prompt"):
    """Content hashes of ``n`` blocks (opaque 32-byte keys)."""
    return [hashlib.sha256(f"{tag} {i}".encode()).digest() for i in range(start, start + n)]


def store(tier, kv, gpu_ids, hashes, salt=SALT):
    job = tier.wait(tier.submit_prefix_write(kv, list(zip(gpu_ids, hashes)), salt))
    assert job.ok, job.error
    return job


def load(tier, hashes, salt=SALT, geometry=SMALL):
    """Prefix-read ``hashes`` into GPU blocks 0.. of a sentinel-filled cache: (job, cache)."""
    back = torch.full((geometry.num_layers, 2, len(hashes) + 1, geometry.block_size,
                       geometry.num_kv_heads, geometry.head_dim), 3.0,
                      dtype=getattr(torch, geometry.dtype))
    job = tier.wait(tier.submit_prefix_read(back, [(h, i) for i, h in enumerate(hashes)], salt))
    return job, back


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_blocks_survive_a_restart_bit_exact(flash, layout, policy):
    geometry = KVGeometry(3, 1, 5, 3, "bfloat16")  # padded slices
    kv = random_kv(geometry, 10, seed=1)
    hashes = chain(6)
    tier = flash(geometry, layout=layout, policy=policy, num_blocks=24)
    job = store(tier, kv, [9, 2, 4, 0, 7, 5], hashes)
    assert job.blocks_ok == 6 and job.skipped == 0 and len(job.tier_blocks) == 6
    assert tier.lookup_prefix(hashes, SALT) == 6
    tier.close()

    again = flash(geometry, layout=layout, policy=policy, num_blocks=24)
    stats = again.stats()
    assert stats["reused_file"] and stats["epoch"] != tier.epoch
    assert stats["prefix_store_blocks"] == 6 and stats["prefix_store_scan_records"] == 6
    assert again.lookup_prefix(hashes, SALT) == 6
    assert again.lookup_prefix(hashes[:3] + chain(1, tag="other") + hashes[4:], SALT) == 3
    job, back = load(again, hashes, geometry=geometry)
    assert job.ok and job.blocks_ok == 6, job.error
    assert same_bytes(back[:, :, :6], kv[:, :, [9, 2, 4, 0, 7, 5]])
    assert (back[:, :, 6] == 3.0).all()
    assert again.num_free_blocks == 24  # prefix records never hold up a reservation


def test_old_swap_records_are_stale_while_prefix_records_stay_valid(flash):
    tier = flash(num_blocks=16)
    kv = random_kv(SMALL, 8)
    swapped = tier.wait(tier.swap_out_blocks(kv, [0, 1, 2], owner=(7, 1)))
    assert swapped.ok
    hashes = chain(3)
    store(tier, kv, [3, 4, 5], hashes)
    tier.close()

    again = flash(num_blocks=16)
    reserved = again.reserve(16)
    assert set(swapped.tier_blocks) <= set(reserved)
    back = torch.zeros_like(kv)
    job = again.wait(again.submit_swap_in(back, list(zip(swapped.tier_blocks, [0, 1, 2])),
                                          owner=(7, 1)))
    assert job.error_kind is ErrorKind.INTEGRITY and "stale record" in job.error
    assert (back == 0).all()
    again.free(reserved)  # the blocks of the prefix records were handed out: overwritten now
    assert again.lookup_prefix(hashes, SALT) == 0


def test_prefix_records_survive_while_swaps_come_and_go(flash):
    tier = flash(num_blocks=16)
    kv = random_kv(SMALL, 8)
    hashes = chain(3)
    store(tier, kv, [3, 4, 5], hashes)
    tier.close()
    again = flash(num_blocks=16)
    swap = again.wait(again.swap_out_blocks(kv, [0, 1], owner=(2, 0)))
    assert swap.ok and not set(swap.tier_blocks) & {0, 1, 2}  # after the newest record
    job, back = load(again, hashes)
    assert job.ok and same_bytes(back[:, :, :3], kv[:, :, 3:6])


def test_a_prefix_record_is_never_taken_for_a_swap_record(flash):
    tier = flash(num_blocks=4)
    kv = random_kv(SMALL, 4)
    (block,) = store(tier, kv, [0], chain(1)).tier_blocks
    reserved = tier.reserve(4)  # the log comes round: the record is dropped, its bytes remain
    assert block in reserved and tier.lookup_prefix(chain(1), SALT) == 0
    job = tier.wait(tier.submit_swap_in(torch.zeros_like(kv), [(block, 0)], owner=(0, 0)))
    assert job.error_kind is ErrorKind.INTEGRITY
    assert "holds a prefix record, expected a swap record" in job.error


def test_a_different_salt_finds_nothing_and_overwrites_in_turn(flash):
    tier = flash(num_blocks=8)
    kv = random_kv(SMALL, 8)
    hashes = chain(4)
    store(tier, kv, range(4), hashes)
    assert tier.lookup_prefix(hashes, OTHER_SALT) == 0
    job, back = load(tier, hashes, salt=OTHER_SALT)
    assert job.ok and job.pairs == () and job.blocks_ok == 0 and (back == 3.0).all()
    other = store(tier, kv, range(4), hashes, salt=OTHER_SALT)  # the same hashes, other model
    assert other.blocks_ok == 4 and other.tier_blocks == [4, 5, 6, 7]
    assert tier.lookup_prefix(hashes, SALT) == 4 and tier.lookup_prefix(hashes, OTHER_SALT) == 4
    store(tier, kv, range(2), chain(2, tag="third"), salt=OTHER_SALT)  # the head wraps
    assert tier.lookup_prefix(hashes[2:], SALT) == 2 and tier.lookup_prefix(hashes, SALT) == 0
    assert tier.stats()["prefix_store_blocks"] == 8


def four_stored_one_damaged(flash, path, layout, *, which, layer, kind, offset):
    """A tier of 16 blocks holding a chain of four prefix records (GPU blocks 4-7 of ``kv``),
    a byte of record ``which``'s (layer, K/V) slice flipped on the file: (tier, kv, hashes,
    the damaged record's tier block)."""
    tier = flash(layout=layout, num_blocks=16)
    kv = random_kv(SMALL, 8)
    hashes = chain(4)
    bad = store(tier, kv, [4, 5, 6, 7], hashes).tier_blocks[which]
    flip_byte(path, tier.layout.data_file_offset(layer, kind, bad) + offset)
    return tier, kv, hashes, bad


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_corrupted_record_becomes_a_miss(flash, tmp_path, layout):
    tier, kv, hashes, bad = four_stored_one_damaged(flash, tmp_path / "cache.kvc", layout,
                                                    which=1, layer=1, kind=0, offset=9)
    read, back = load(tier, hashes)
    assert read.status is JobStatus.FAILED and read.error_kind is ErrorKind.INTEGRITY
    assert f"FC block {bad} layer 1 K" in read.error
    assert read.blocks_ok == 1  # use block 0, recompute from block 1 on
    assert same_bytes(back[:, :, 0], kv[:, :, 4]) and (back[:, :, 1] == 3.0).all()
    assert same_bytes(back[:, :, 2:4], kv[:, :, 6:8])  # verified blocks after it arrive too
    stats = tier.stats()
    assert stats["prefix_store_records_dropped"] == 1 and stats["prefix_store_blocks"] == 3
    assert tier.lookup_prefix(hashes, SALT) == 1
    assert tier.lookup_prefix(hashes[2:], SALT) == 2

    rewritten = store(tier, kv, [5], hashes[1:2])  # recomputed and stored again
    assert rewritten.tier_blocks != [bad] and tier.lookup_prefix(hashes, SALT) == 4
    tier.close()
    again = flash(layout=layout, num_blocks=16)
    # the torn record's header was zeroed; the newer record of that hash is found at open
    read, back = load(again, hashes)
    assert read.ok and read.blocks_ok == 4 and same_bytes(back[:, :, :4], kv[:, :, 4:8])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_record_whose_payload_failed_is_not_indexed_again_at_open(flash, tmp_path, layout):
    path = tmp_path / "cache.kvc"
    tier, kv, hashes, bad = four_stored_one_damaged(flash, path, layout, which=2, layer=0,
                                                    kind=1, offset=3)
    headers = [tier.layout.header_file_offset(b) for b in range(16)]
    before = path.read_bytes()
    written = [b for b, at in enumerate(headers) if before[at:at + 8] == b"HIFCREC1"]
    assert len(written) == 4 and bad in written
    read, _ = load(tier, hashes)
    assert read.error_kind is ErrorKind.INTEGRITY and read.blocks_ok == 2
    # the header, which alone looks valid, is zeroed on the file; the records beside it are not
    after = path.read_bytes()
    assert after[headers[bad]:headers[bad] + HEADER_BYTES] == bytes(HEADER_BYTES)
    assert [b for b, at in enumerate(headers) if after[at:at + 8] == b"HIFCREC1"] \
        == [b for b in written if b != bad]
    tier.close()

    again = flash(layout=layout, num_blocks=16)
    stats = again.stats()
    assert stats["prefix_store_scan_records"] == 3 and stats["prefix_store_blocks"] == 3
    assert again.lookup_prefix(hashes, SALT) == 2 and again.lookup_prefix(hashes[3:], SALT) == 1
    read, back = load(again, hashes[:2])
    assert read.ok and same_bytes(back[:, :, :2], kv[:, :, 4:6])


def test_a_failed_header_invalidation_leaves_the_read_an_integrity_failure(flash, tmp_path):
    tier = flash(num_blocks=16, fault_injection=True)
    kv = random_kv(SMALL, 8)
    hashes = chain(2)
    job = store(tier, kv, [0, 1], hashes)
    flip_byte(tmp_path / "cache.kvc", tier.layout.data_file_offset(0, 0, job.tier_blocks[1]))
    tier.faults.arm("write", "eio")  # the write that would zero the record's header
    read, back = load(tier, hashes)
    assert read.error_kind is ErrorKind.INTEGRITY and read.blocks_ok == 1
    assert tier.faults.hits == 1 and tier.lookup_prefix(hashes, SALT) == 1
    tier.close()
    again = flash(num_blocks=16)  # the header is intact: indexed, and rejected when read
    assert again.lookup_prefix(hashes, SALT) == 2
    read, _ = load(again, hashes)
    assert read.error_kind is ErrorKind.INTEGRITY and read.blocks_ok == 1
    again.close()
    assert flash(num_blocks=16).lookup_prefix(hashes, SALT) == 1  # that read zeroed it


def test_a_corrupted_header_is_not_indexed_at_open(flash, tmp_path):
    tier = flash(num_blocks=16)
    kv = random_kv(SMALL, 8)
    hashes = chain(3)
    job = store(tier, kv, [0, 1, 2], hashes)
    tier.close()
    path = tmp_path / "cache.kvc"
    flip_byte(path, tier.layout.header_file_offset(job.tier_blocks[1]) + 200)
    # block 2's record copied over an empty block: its block id does not match the place
    fd = os.open(path, os.O_RDWR)
    record = os.pread(fd, tier.layout.per_block_file_bytes,
                      tier.layout.header_file_offset(job.tier_blocks[2]))
    os.pwrite(fd, record, tier.layout.header_file_offset(12))
    os.close(fd)
    again = flash(num_blocks=16)
    assert again.stats()["prefix_store_blocks"] == 2
    assert again.lookup_prefix(hashes, SALT) == 1 and again.lookup_prefix(hashes[2:], SALT) == 1


def test_other_geometry_or_format_reinitialises_the_file(flash, tmp_path):
    tier = flash(num_blocks=8)
    kv = random_kv(SMALL, 4)
    hashes = chain(2)
    store(tier, kv, [0, 1], hashes)
    tier.close()
    other = KVGeometry(2, 2, 32, 16, "bfloat16")  # same shape, other dtype
    moved = flash(other, num_blocks=8)
    assert not moved.stats()["reused_file"] and moved.lookup_prefix(hashes, SALT) == 0
    moved.close()
    back = flash(num_blocks=8)
    assert not back.stats()["reused_file"] and back.lookup_prefix(hashes, SALT) == 0
    store(back, kv, [0, 1], hashes)
    back.close()
    path = tmp_path / "cache.kvc"  # a file of format version 1 (no prefix records)
    with open(path, "r+b") as f:
        page = bytearray(f.read(HEADER_BYTES))
        struct.pack_into("<I", page, 8, 1)
        body = 8 + 4 * 6 + 16 * 2 + 32 + 8 * 3  # the superblock fields before its crc
        struct.pack_into("<I", page, body, crc32c.crc32c(bytes(page[:body])))
        f.seek(0)
        f.write(page)
    old = flash(num_blocks=8)
    assert not old.stats()["reused_file"] and old.lookup_prefix(hashes, SALT) == 0


def test_the_append_log_overwrites_the_oldest_records_never_a_pinned_one(flash):
    tier = flash(num_blocks=16, chunk_mib=1)
    kv = random_kv(SMALL, 8)
    hashes = chain(16)
    for first in (0, 8):
        assert store(tier, kv, range(8), hashes[first:first + 8]).tier_blocks == \
            list(range(first, first + 8))
    assert tier.lookup_prefix(hashes, SALT) == 16 and tier.num_free_blocks == 16
    io = gated(tier)
    reading = tier.submit_prefix_read(torch.zeros_like(kv), [(hashes[0], 0)], SALT)
    assert tier.num_free_blocks == 15 and tier.stats()["prefix_store_pinned_blocks"] == 1
    swap = tier.swap_out_blocks(kv, [0, 1, 2], owner=(1, 0))  # the head wraps to block 0
    assert swap.tier_blocks == [1, 2, 3]  # block 0 is being read: skipped
    assert tier.lookup_prefix(hashes, SALT) == 1 and tier.lookup_prefix(hashes[4:], SALT) == 12
    io.gate.set()
    assert tier.wait(reading).ok and tier.wait(swap).ok
    assert tier.reserve(2) == [4, 5]  # the log goes on in order; block 0 waits for the next lap
    assert tier.lookup_prefix(hashes[:1], SALT) == 1
    assert tier.stats()["allocator"]["backward_jumps"] == 0


def test_left_append_uses_empty_blocks_first_then_reclaims_the_oldest(flash):
    tier = flash(num_blocks=8, policy="left-append")
    kv = random_kv(SMALL, 8)
    old, new = chain(3, tag="old"), chain(3, tag="new")
    assert store(tier, kv, range(3), old).tier_blocks == [0, 1, 2]
    assert store(tier, kv, range(3), new).tier_blocks == [3, 4, 5]
    assert tier.num_free_blocks == 8 and tier.can_reserve(8)
    swap = tier.wait(tier.swap_out_blocks(kv, [6, 7], owner=(1, 0)))
    assert swap.tier_blocks == [6, 7]  # empty blocks before any record
    assert tier.lookup_prefix(old, SALT) == 3 and tier.lookup_prefix(new, SALT) == 3
    io = gated(tier)
    reading = tier.submit_prefix_read(torch.zeros_like(kv), [(old[0], 0)], SALT)
    assert tier.reserve(3) == [1, 2, 3]  # the oldest unpinned records, the pinned one skipped
    assert tier.lookup_prefix(old[:1], SALT) == 1 and tier.lookup_prefix(new, SALT) == 0
    assert tier.lookup_prefix(new[1:], SALT) == 2 and tier.num_free_blocks == 2
    assert not tier.can_reserve(3)
    io.gate.set()
    assert tier.wait(reading).ok and tier.num_free_blocks == 3


@pytest.mark.parametrize("policy", POLICIES)
def test_swap_reservations_never_fail_on_a_log_full_of_prefix_records(flash, policy):
    tier = flash(num_blocks=16, policy=policy)
    kv = random_kv(SMALL, 16)
    for first in (0, 8):
        store(tier, kv, range(first, first + 8), chain(8, first))
    assert tier.stats()["prefix_store_blocks"] == 16
    assert tier.can_reserve(16) and tier.num_free_blocks == 16
    job = tier.wait(tier.swap_out_blocks(kv, range(16), owner=(1, 0)))
    assert job.ok and sorted(job.tier_blocks) == list(range(16))
    assert tier.stats()["prefix_store_blocks"] == 0 and tier.num_free_blocks == 0
    back = torch.zeros_like(kv)
    assert tier.wait(tier.submit_swap_in(back, list(zip(job.tier_blocks, range(16))),
                                         (1, 0))).ok
    assert same_bytes(back, kv)
    tier.free(job.tier_blocks)
    assert tier.num_free_blocks == 16


@pytest.mark.parametrize("policy", POLICIES)
def test_held_records_outlast_the_log_until_released(flash, policy):
    """A preempted sequence's stored blocks, held while its other blocks are swapped out."""
    tier = flash(num_blocks=8, policy=policy)
    kv = random_kv(SMALL, 8)
    hashes = chain(4)
    store(tier, kv, range(4), hashes)
    held = tier.hold_prefix(hashes[:2] + chain(1, tag="not stored") + hashes[3:], SALT)
    assert len(held) == 2 and tier.num_free_blocks == 6
    swap = tier.wait(tier.swap_out_blocks(kv, range(6), owner=(1, 0)))  # the log comes round
    assert swap.ok and not set(swap.tier_blocks) & set(held)
    assert tier.lookup_prefix(hashes, SALT) == 2 and tier.stats()["prefix_store_held_blocks"] == 2
    job, back = load(tier, hashes[:2])
    assert job.ok and same_bytes(back[:, :, :2], kv[:, :, :2])
    with pytest.raises(ValueError, match="not held"):
        tier.release_prefix([swap.tier_blocks[0]])
    tier.release_prefix(held)
    with pytest.raises(ValueError, match="not held"):
        tier.release_prefix(held[:1])
    tier.free(swap.tier_blocks)
    assert tier.num_free_blocks == 8 and tier.lookup_prefix(hashes, SALT) == 2


def test_stored_or_in_flight_hashes_are_not_written_twice(flash):
    tier = flash(num_blocks=16)
    kv = random_kv(SMALL, 8)
    hashes = chain(4)
    store(tier, kv, [0, 1], hashes[:2])
    job = store(tier, kv, [0, 1, 2, 3, 4], hashes[:3] + hashes[2:4])
    assert [h for h in job.hashes] == hashes[2:4] and job.skipped == 3 and job.requested == 5
    assert job.tier_blocks == [2, 3] and job.blocks_ok == 2
    io = gated(tier)
    first = tier.submit_prefix_write(kv, [(5, chain(1, tag="x")[0])], SALT)
    second = tier.submit_prefix_write(kv, [(6, chain(1, tag="x")[0])], SALT)
    assert len(first.pairs) == 1 and second.pairs == () and second.skipped == 1
    assert tier.lookup_prefix(chain(1, tag="x"), SALT) == 0  # published when written
    io.gate.set()
    assert tier.wait(first).ok and tier.wait(second).ok and second.blocks_ok == 0
    assert tier.lookup_prefix(chain(1, tag="x"), SALT) == 1
    stats = tier.stats()
    assert stats["prefix_store_write_dedups"] == 4 and stats["allocator"]["blocks_written"] == 5


def test_writes_in_flight_are_bounded(flash):
    tier = flash(num_blocks=16)  # at most half the log in flight: 8 blocks
    kv = random_kv(SMALL, 12)
    io = gated(tier)
    first = tier.submit_prefix_write(kv, list(zip(range(6), chain(6))), SALT)
    second = tier.submit_prefix_write(kv, list(zip(range(6), chain(6, 6))), SALT)
    assert len(first.pairs) == 6 and len(second.pairs) == 2 and second.skipped == 4
    assert tier.can_reserve(8) and not tier.can_reserve(9)  # swaps keep the rest
    io.gate.set()
    tier.wait_all()
    assert tier.lookup_prefix(chain(8), SALT) == 8
    assert tier.stats()["prefix_store_write_drops"] == 4


def test_close_cancels_prefix_io_not_started(flash):
    tier = flash(num_blocks=32)
    kv = random_kv(SMALL, 12)
    io = gated(tier, chunk_blocks=1, num_buffers=1)
    job = tier.submit_prefix_write(kv, list(zip(range(12), chain(12))), SALT)
    assert io.arrived.wait(10)  # the first chunk holds the only buffer set, at the gate
    cancel_queued = tier.mover.cancel_queued

    def cancel_then_open_the_gate():
        cancel_queued()
        io.gate.set()

    tier.mover.cancel_queued = cancel_then_open_the_gate
    tier.close()  # the chunk holding the only buffer set finishes; the others never start
    assert job.error_kind is ErrorKind.CANCELLED and job.blocks_ok == 1


def test_failed_writes_publish_nothing_and_failed_reads_drop_the_record(flash):
    tier = flash(num_blocks=8, fault_injection=True)
    kv = random_kv(SMALL, 4)
    hashes = chain(2)
    tier.faults.arm("write", "eio")
    job = tier.wait(tier.submit_prefix_write(kv, list(zip([0, 1], hashes)), SALT))
    assert job.error_kind is ErrorKind.IO_ERROR and job.blocks_ok == 0
    assert tier.lookup_prefix(hashes, SALT) == 0 and tier.num_free_blocks == 8
    store(tier, kv, [0, 1], hashes)
    tier.faults.arm("read", "eio")
    job, back = load(tier, hashes)
    assert job.error_kind is ErrorKind.IO_ERROR and job.blocks_ok == 0 and (back == 3.0).all()
    assert tier.lookup_prefix(hashes, SALT) == 0 and tier.num_free_blocks == 8


def test_statistics_count_tokens_blocks_and_bytes(flash):
    tier = flash(num_blocks=16)
    kv = random_kv(SMALL, 8)
    hashes = chain(4)
    store(tier, kv, range(3), hashes[:3])
    assert tier.lookup_prefix(hashes, SALT) == 3
    load(tier, hashes)
    stats = tier.stats()
    tokens = SMALL.block_size
    assert stats["prefix_store_queries"] == 4 * tokens and stats["prefix_store_hits"] == 3 * tokens
    assert stats["prefix_store_bytes_written"] == 3 * SMALL.block_bytes
    assert stats["prefix_store_bytes_read"] == 3 * SMALL.block_bytes
    assert stats["prefix_store_blocks"] == 3 and stats["prefix_store_pinned_blocks"] == 0
    assert stats["prefix_write_ok"] == 1 and stats["prefix_read_ok"] == 1


def test_the_log_resumes_after_its_newest_record(flash):
    tier = flash(num_blocks=16)
    kv = random_kv(SMALL, 8)
    store(tier, kv, range(4), chain(4))
    swap = tier.wait(tier.swap_out_blocks(kv, [4, 5], owner=(1, 0)))
    assert swap.tier_blocks == [4, 5]
    tier.close()
    again = flash(num_blocks=16)
    assert again.reserve(1) == [6]
    assert again.stats()["prefix_store_blocks"] == 4


def test_prefix_store_off(flash):
    tier = flash(num_blocks=8)
    kv = random_kv(SMALL, 4)
    store(tier, kv, [0], chain(1))
    tier.close()
    off = flash(num_blocks=8, prefix_store="off")
    assert off.lookup_prefix(chain(1), SALT) == 0
    assert "prefix_store_scan_seconds" not in off.stats()
    with pytest.raises(ValueError, match="prefix store is off"):
        off.submit_prefix_write(kv, [(0, chain(1)[0])], SALT)
    assert not TierConfig(kv_offload="flash", flash_path="x", num_tier_blocks=4,
                          prefix_store="off").stores_prefixes
    assert not TierConfig(kv_offload="dram", num_tier_blocks=4).stores_prefixes
    with pytest.raises(ValueError, match="prefix_store must be one of off, evicted, all"):
        TierConfig(kv_offload="flash", flash_path="x", num_tier_blocks=4, prefix_store="some")


def test_bad_input_raises_clear_value_errors(flash):
    tier = flash(num_blocks=8)
    kv = random_kv(SMALL, 4)
    h = chain(2)
    writes = [
        (kv, [(0, h[0])], b"short", "salt must be 32 bytes"),
        (kv, [(0, h[0][:16])], SALT, "block_hash must be 32 bytes"),
        (kv, [(0, "x" * 32)], SALT, "block_hash must be 32 bytes"),
        (kv, [(h[0], 0)], SALT, "block ids must be ints"),
        (kv, [(0, h[0], 1)], SALT, "pairs must be"),
        (kv, [(9, h[0])], SALT, "out of range"),
        (kv, [(0, h[0]), (0, h[1])], SALT, "repeat"),
        (kv.float(), [(0, h[0])], SALT, "dtype"),
    ]
    for cache, pairs, salt, message in writes:
        with pytest.raises(ValueError, match=message):
            tier.submit_prefix_write(cache, pairs, salt)
    store(tier, kv, [0, 1], h)
    reads = [
        (kv, [(h[0], 0), (h[0], 1)], SALT, "repeat a block hash"),
        (kv, [(0, h[0])], SALT, "block_hash must be 32 bytes"),
        (kv, [(h[0], -1)], SALT, "out of range"),
    ]
    for cache, pairs, salt, message in reads:
        with pytest.raises(ValueError, match=message):
            tier.submit_prefix_read(cache, pairs, salt)
    with pytest.raises(ValueError, match="salt"):
        tier.lookup_prefix(h, None)
    with pytest.raises(ValueError, match="not reserved"):
        tier.free([0])  # a prefix record's block is not the caller's
    assert tier.lookup_prefix(h, SALT) == 2 and tier.poll() == []


def mixed_log_trace(tier, path, seed=5, steps=400):
    """Swap-outs held a while, frees and prefix writes, interleaved; exports the write trace."""
    rng = random.Random(seed)
    kv = random_kv(SMALL, 16)
    held, counter = [], 0
    for step in range(steps):
        if rng.random() < 0.5:
            n = rng.randint(1, 8)
            job = tier.submit_prefix_write(kv, list(zip(range(n), chain(n, counter))), SALT)
            counter += n
            assert tier.wait(job).ok
        elif held and (rng.random() < 0.5 or tier.num_free_blocks < 16):
            tier.free(held.pop(rng.randrange(len(held))))
        else:
            job = tier.wait(tier.swap_out_blocks(kv, range(rng.randint(1, 16)), (step, 0)))
            assert job.ok
            held.append(job.tier_blocks)
    tier.allocator.export_trace(path)
    return load_trace(path)


def test_the_mixed_log_stays_sequential(flash, tmp_path):
    """Prefix writes share the append log with swaps: the write trace only moves forward (it
    skips blocks still held), and replays near WAF 1 on the simulated SSD, where the same
    workload under left-append does not."""
    drive = WafSimConfig(tier_blocks=256, block_bytes=4 << 14, page_bytes=16 << 10,
                         pages_per_erase_block=64, over_provisioning=0.2)
    waf = {}
    for policy in POLICIES:
        tier = flash(num_blocks=256, policy=policy, chunk_mib=1, name=f"{policy}.kvc")
        waf[policy] = replay(mixed_log_trace(tier, tmp_path / f"{policy}.txt"), drive).waf
        stats = tier.stats()
        assert stats["prefix_store_blocks"] > 0 and stats["allocator"]["blocks_written"] > 1000
        if policy == "append":
            assert stats["allocator"]["backward_jumps"] == 0 and stats["allocator"]["wraps"] >= 3
    assert waf["append"] < 1.1 and waf["left-append"] > waf["append"] + 0.3, waf


def test_the_prefix_index_and_the_scan_import_without_torch():
    code = textwrap.dedent("""
        import sys
        sys.modules['torch'] = None  # any 'import torch' now fails
        from hifc.tiers.allocator import FCBlockAllocator
        from hifc.tiers.flash.prefix_index import PrefixIndex, key_of
        from hifc.tiers.flash.scan import scan_headers
        index = PrefixIndex(FCBlockAllocator(4, 'append'))
        index.load([(2, key_of(b's' * 32, b'h' * 32))])
        assert index.leading_hits(b's' * 32, [b'h' * 32]) == 1
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
