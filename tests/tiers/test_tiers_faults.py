"""Injected faults surface as job errors, and the tier stays usable afterwards."""
import errno

import pytest
import torch

from hifc.tiers import ErrorKind, JobStatus, KVGeometry
from tests.tiers.tier_helpers import random_kv

GEOMETRY = KVGeometry(2, 2, 32, 16, "bfloat16")  # 2 KiB slices


def swap_out(tier, kv, src, owner=(1, 0)):
    ids = tier.reserve(len(src))
    return ids, tier.wait(tier.submit_swap_out(kv, list(zip(src, ids)), owner))


def swap_in(tier, ids, num_blocks, owner=(1, 0)):
    back = torch.zeros((2, 2, num_blocks, 16, 2, 32), dtype=torch.bfloat16)
    job = tier.wait(tier.submit_swap_in(back, list(zip(ids, range(len(ids)))), owner))
    return job, back


def assert_usable(tier, kv):
    ids, out = swap_out(tier, kv, [0, 1, 2])
    assert out.ok, out.error
    job, back = swap_in(tier, ids, 3)
    assert job.ok, job.error
    assert torch.equal(back, kv[:, :, :3])
    tier.free(ids)


@pytest.mark.parametrize("layout", ["block-record", "layer-kv"])
@pytest.mark.parametrize("effect,kind,code", [
    ("eio", ErrorKind.IO_ERROR, errno.EIO),
    ("enospc", ErrorKind.NO_SPACE, errno.ENOSPC),
])
def test_write_faults(flash, layout, effect, kind, code):
    tier = flash(GEOMETRY, layout=layout, num_blocks=16, fault_injection=True)
    kv = random_kv(GEOMETRY, 3)
    tier.faults.arm("write", effect)
    ids, job = swap_out(tier, kv, [0, 1, 2])
    assert job.status is JobStatus.FAILED and job.error_kind is kind and job.errno == code
    assert "injected" in job.error
    tier.free(ids)  # the engine frees the reservation and keeps the GPU blocks
    assert tier.faults.armed == 0
    assert_usable(tier, kv)
    stats = tier.stats()
    assert stats["swap_out_failed"] == 1 and stats[f"error_{kind.value}"] == 1
    assert stats["num_free_blocks"] == 16


@pytest.mark.parametrize("layout", ["block-record", "layer-kv"])
@pytest.mark.parametrize("effect,kind", [
    ("eio", ErrorKind.IO_ERROR),
    ("short", ErrorKind.SHORT_READ),
    ("bitflip", ErrorKind.INTEGRITY),
])
def test_read_faults(flash, layout, effect, kind):
    tier = flash(GEOMETRY, layout=layout, num_blocks=16, fault_injection=True)
    kv = random_kv(GEOMETRY, 3)
    ids, out = swap_out(tier, kv, [0, 1, 2])
    assert out.ok
    tier.faults.arm("read", effect)
    job, back = swap_in(tier, ids, 3)
    assert job.status is JobStatus.FAILED and job.error_kind is kind, job.error
    assert not torch.equal(back, kv[:, :, :3])  # the failed chunk was not copied in
    job, back = swap_in(tier, ids, 3)  # the stored data is intact: a retry succeeds
    assert job.ok and torch.equal(back, kv[:, :, :3])
    tier.free(ids)
    assert_usable(tier, kv)


@pytest.mark.parametrize("offset", [0, 100, 4096 + 5, 4096 * 3 + 1])
def test_bitflip_anywhere_in_a_read_is_caught(flash, offset):
    tier = flash(GEOMETRY, layout="block-record", num_blocks=8, fault_injection=True)
    kv = random_kv(GEOMETRY, 2)
    ids, _ = swap_out(tier, kv, [0, 1])
    tier.faults.arm("read", "bitflip", byte_offset=offset)
    job, _ = swap_in(tier, ids, 2)
    assert job.error_kind is ErrorKind.INTEGRITY


def test_skip_and_times(flash):
    tier = flash(GEOMETRY, layout="block-record", num_blocks=16, fault_injection=True,
                 io_threads=1)
    kv = random_kv(GEOMETRY, 3)
    tier.faults.arm("write", "eio", skip=1, times=2)
    results = []
    for _ in range(4):
        ids, job = swap_out(tier, kv, [0])
        results.append(job.ok)
        tier.free(ids)
    assert results == [True, False, False, True]
    assert tier.faults.hits == 2


def test_fault_arguments_are_checked(flash):
    tier = flash(GEOMETRY, fault_injection=True)
    with pytest.raises(ValueError, match="effect for write"):
        tier.faults.arm("write", "short")
    with pytest.raises(ValueError, match="op"):
        tier.faults.arm("erase", "eio")
    assert flash(GEOMETRY, name="plain.kvc").faults is None
