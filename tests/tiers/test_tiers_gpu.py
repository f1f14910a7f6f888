"""GPU KV caches through the tier: kvikio (cuFile), POSIX from pinned staging, pinned DRAM."""
import os
import random

import pytest
import torch

from hifc.tiers import ErrorKind, KVGeometry, TierConfig, make_tier
from hifc.tiers.flash.kvikio_io import kvikio_available
from tests.tiers.tier_helpers import random_kv

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GEOMETRIES = [
    KVGeometry(4, 8, 128, 16, "float16"),  # 32 KiB slices
    KVGeometry(2, 2, 5, 3, "bfloat16"),  # padded slices
    KVGeometry(3, 4, 64, 32, "float32"),
]


def gpu_tier(tmp_path, geometry, backend, **kw):
    config = TierConfig(kv_offload="flash", flash_path=str(tmp_path / f"{backend}.kvc"),
                        num_tier_blocks=48, flash_backend=backend, flash_chunk_mib=1,
                        flash_io_threads=4, **kw)
    return make_tier(config, geometry, device="cuda")


def round_trip(tier, kv, owner=(2, 1), seed=0):
    n = kv.shape[2]
    rng = random.Random(seed)
    src, dst = rng.sample(range(n), n), rng.sample(range(n), n)
    ids = tier.reserve(n)
    kv.mul_(-1)  # queued on the current stream just before the swap: must be seen by it
    out = tier.submit_swap_out(kv, list(zip(src, ids)), owner)
    assert tier.wait(out).ok, out.error
    back = torch.full_like(kv, 5)
    job = tier.wait(tier.submit_swap_in(back, list(zip(ids, dst)), owner))
    assert job.ok, job.error
    torch.cuda.synchronize()
    assert torch.equal(back[:, :, dst].view(torch.uint8), kv[:, :, src].view(torch.uint8))
    return ids


@pytest.mark.parametrize("layout", ["block-record", "layer-kv"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.dtype)
@pytest.mark.parametrize("backend", ["kvikio", "posix"])
def test_gpu_round_trip_bit_exact(tmp_path, backend, geometry, layout):
    if backend == "kvikio" and not kvikio_available():
        pytest.skip("kvikio not installed")
    with gpu_tier(tmp_path, geometry, backend, flash_layout=layout) as tier:
        assert tier.stats()["backend"] == backend
        kv = random_kv(geometry, 40, device="cuda")
        ids = round_trip(tier, kv)
        tier.free(ids)
        round_trip(tier, kv, seed=1)


def test_gpu_corruption_rejected_and_faults_reported(tmp_path):
    if not kvikio_available():
        pytest.skip("kvikio not installed")
    geometry = GEOMETRIES[0]
    with gpu_tier(tmp_path, geometry, "kvikio", tier_fault_injection=True) as tier:
        kv = random_kv(geometry, 4, device="cuda")
        ids = tier.reserve(4)
        assert tier.wait(tier.submit_swap_out(kv, list(zip(range(4), ids)), (1, 0))).ok
        fd = os.open(tmp_path / "kvikio.kvc", os.O_RDWR)
        at = tier.layout.data_file_offset(2, 1, ids[3]) + 77
        byte = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([byte[0] ^ 1]), at)
        back = torch.zeros_like(kv)
        job = tier.wait(tier.submit_swap_in(back, list(zip(ids, range(4))), (1, 0)))
        assert job.error_kind is ErrorKind.INTEGRITY and "layer 2 V" in job.error
        assert (back[:, :, 3] == 0).all()
        os.pwrite(fd, byte, at)
        os.close(fd)
        tier.faults.arm("read", "eio")
        job = tier.wait(tier.submit_swap_in(back, list(zip(ids, range(4))), (1, 0)))
        assert job.error_kind is ErrorKind.IO_ERROR
        job = tier.wait(tier.submit_swap_in(back, list(zip(ids, range(4))), (1, 0)))
        assert job.ok and torch.equal(back, kv)


@pytest.mark.parametrize("backend", ["kvikio", "posix"])
def test_gpu_prefix_store_across_a_restart(tmp_path, backend):
    """Prefix blocks written from a CUDA KV cache are found and read back after a reopen; a
    corrupted one never reaches the cache, the others of its chunk do."""
    import hashlib

    if backend == "kvikio" and not kvikio_available():
        pytest.skip("kvikio not installed")
    geometry = GEOMETRIES[0]  # 1 MiB chunks of 3 blocks
    salt = hashlib.sha256(b"gpu test model").digest()
    hashes = [hashlib.sha256(b"block %d" % i).digest() for i in range(12)]
    kv = random_kv(geometry, 16, device="cuda")
    src = random.Random(4).sample(range(16), 12)
    with gpu_tier(tmp_path, geometry, backend) as tier:
        kv.mul_(-1)  # queued on the current stream just before the write: must be seen by it
        job = tier.wait(tier.submit_prefix_write(kv, list(zip(src, hashes)), salt))
        assert job.ok and job.blocks_ok == 12, job.error
        bad = job.tier_blocks[4]
    with gpu_tier(tmp_path, geometry, backend) as tier:
        assert tier.stats()["reused_file"] and tier.lookup_prefix(hashes, salt) == 12
        fd = os.open(tmp_path / f"{backend}.kvc", os.O_RDWR)
        at = tier.layout.data_file_offset(3, 0, bad) + 5
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 4]), at)
        os.close(fd)
        back = torch.full_like(kv, 5)
        job = tier.wait(tier.submit_prefix_read(back, [(h, i) for i, h in enumerate(hashes)],
                                                salt))
        torch.cuda.synchronize()
        assert job.error_kind is ErrorKind.INTEGRITY and job.blocks_ok == 4
        got, want = back.view(torch.uint8), kv.view(torch.uint8)
        assert torch.equal(got[:, :, :4], want[:, :, src[:4]])
        assert (back[:, :, 4] == 5).all()
        assert torch.equal(got[:, :, 5:12], want[:, :, src[5:]])
        assert tier.lookup_prefix(hashes, salt) == 4 and tier.lookup_prefix(hashes[5:], salt) == 7


def test_pinned_dram_tier_on_gpu():
    geometry = GEOMETRIES[0]
    tier = make_tier(TierConfig(kv_offload="dram", num_tier_blocks=64), geometry, device="cuda")
    assert tier.stats()["pinned"] is True
    kv = random_kv(geometry, 32, device="cuda")
    round_trip(tier, kv)
    tier.close()
