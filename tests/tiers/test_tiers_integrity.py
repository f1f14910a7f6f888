"""A stale, torn or corrupted record is rejected and never reaches the KV cache."""
import itertools
import os
import random

import pytest
import torch

from hifc.tiers import ErrorKind, KVGeometry
from hifc.tiers.flash.layout import HEADER_BYTES, LAYOUTS
from tests.tiers.tier_helpers import flip_byte, random_kv

GEOMETRY = KVGeometry(2, 2, 16, 8, "float16")  # 512-byte slices


def write_blocks(tier, kv, src, owner=(4, 2)):
    ids = tier.reserve(len(src))
    job = tier.wait(tier.submit_swap_out(kv, list(zip(src, ids)), owner))
    assert job.ok, job.error
    return ids


def read_back(tier, ids, owner=(4, 2)):
    """Swap in to a sentinel-filled cache; returns (job, cache)."""
    back = torch.full((2, 2, len(ids), 8, 2, 16), 3.0, dtype=torch.float16)
    job = tier.wait(tier.submit_swap_in(back, list(zip(ids, range(len(ids)))), owner))
    return job, back


def stored_byte_offsets(layout, block, rng, samples_per_slice=3):
    """File offsets of bytes belonging to a stored block: header page and every slice."""
    g = layout.geometry
    header = layout.header_file_offset(block)
    yield from (header + o for o in (0, 12, 20, 40, 64, 70, HEADER_BYTES - 1))
    for layer, kind in itertools.product(range(g.num_layers), (0, 1)):
        base = layout.data_file_offset(layer, kind, block)
        yield base
        yield base + g.slice_bytes - 1
        yield from (base + rng.randrange(g.slice_bytes) for _ in range(samples_per_slice))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_any_corrupted_byte_is_rejected(flash, tmp_path, layout):
    tier = flash(GEOMETRY, layout=layout, num_blocks=8)
    kv = random_kv(GEOMETRY, 3)
    ids = write_blocks(tier, kv, [0, 1, 2])
    path = tmp_path / "cache.kvc"
    offsets = list(stored_byte_offsets(tier.layout, ids[1], random.Random(7)))
    assert len(offsets) > 20
    for offset in offsets:
        flip_byte(path, offset, mask=0x40)
        job, back = read_back(tier, ids)
        assert not job.ok and job.error_kind is ErrorKind.INTEGRITY, (offset, job.error)
        assert f"FC block {ids[1]}" in job.error
        assert (back[:, :, 1] == 3.0).all(), "a rejected block reached the KV cache"
        flip_byte(path, offset, mask=0x40)  # repair
    job, back = read_back(tier, ids)
    assert job.ok and torch.equal(back, kv)


def test_stale_epoch_after_reopen_is_rejected(flash, tmp_path):
    tier = flash(GEOMETRY, num_blocks=8)
    kv = random_kv(GEOMETRY, 3)
    ids = write_blocks(tier, kv, [0, 1, 2])
    tier.close()
    again = flash(GEOMETRY, num_blocks=8)  # same file, new epoch
    assert again.stats()["reused_file"]
    # the log resumes after its newest record, so the old blocks come last, never rewritten
    assert again.reserve(8)[-3:] == ids
    job, back = read_back(again, ids)
    assert job.error_kind is ErrorKind.INTEGRITY and "stale record" in job.error
    assert "epoch" in job.error and (back == 3.0).all()


def test_wrong_owner_generation_is_rejected(flash):
    tier = flash(GEOMETRY, num_blocks=8)
    ids = write_blocks(tier, random_kv(GEOMETRY, 2), [0, 1], owner=(4, 2))
    job, _ = read_back(tier, ids, owner=(4, 3))
    assert job.error_kind is ErrorKind.INTEGRITY and "(4, 3)" in job.error
    job, _ = read_back(tier, ids, owner=(5, 2))
    assert job.error_kind is ErrorKind.INTEGRITY


def test_record_moved_to_another_block_is_rejected(flash, tmp_path):
    tier = flash(GEOMETRY, layout="block-record", num_blocks=8)
    ids = write_blocks(tier, random_kv(GEOMETRY, 2), [0, 1])
    rec = tier.layout.per_block_file_bytes
    fd = os.open(tmp_path / "cache.kvc", os.O_RDWR)
    record = os.pread(fd, rec, tier.layout.header_file_offset(ids[0]))
    os.pwrite(fd, record, tier.layout.header_file_offset(ids[1]))  # block 0's record at 1
    os.close(fd)
    job, _ = read_back(tier, ids[1:])
    assert job.error_kind is ErrorKind.INTEGRITY
    assert f"holds FC block {ids[0]}, expected {ids[1]}" in job.error


def test_torn_write_is_rejected(flash, tmp_path):
    """New header with the old payload (a write torn between header and data)."""
    tier = flash(GEOMETRY, layout="layer-kv", num_blocks=4, policy="left-append")
    old = random_kv(GEOMETRY, 1, seed=1)
    new = random_kv(GEOMETRY, 1, seed=2)
    (block,) = write_blocks(tier, old, [0])
    layout = tier.layout
    path = tmp_path / "cache.kvc"
    fd = os.open(path, os.O_RDWR)
    slice_at = layout.data_file_offset(1, 1, block)
    old_slice = os.pread(fd, GEOMETRY.slice_bytes, slice_at)
    tier.free([block])
    assert write_blocks(tier, new, [0]) == [block]  # left-append reuses the same block
    os.pwrite(fd, old_slice, slice_at)  # the last slice never made it to the disk
    os.close(fd)
    job, back = read_back(tier, [block])
    assert job.error_kind is ErrorKind.INTEGRITY and "layer 1 V" in job.error
    assert (back == 3.0).all()


def test_never_written_block_is_rejected(flash):
    tier = flash(GEOMETRY, num_blocks=8)
    ids = tier.reserve(2)
    job, _ = read_back(tier, ids)
    assert job.error_kind is ErrorKind.INTEGRITY and "magic" in job.error
