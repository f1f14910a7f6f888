"""Float8 KV caches in the tiers: half the bytes per block, bit-exact round trips, and a cache
file written in one dtype or with one set of scales never serves another."""
import hashlib
import random

import pytest
import torch

from hifc.tiers import KVGeometry, TierConfig, make_tier
from hifc.tiers.flash.cache_file import read_superblock
from hifc.tiers.flash.kvikio_io import kvikio_available
from hifc.tiers.flash.layout import LAYOUTS
from tests.tiers.tier_helpers import SMALL, SMALL_FP8, random_kv, same_bytes

SALT = hashlib.sha256(b"model A").digest()
OTHER_DIGEST = "0" * 31 + "1"


def fp8_kv(num_blocks, device="cpu", seed=0):
    """Random float8 KV of SMALL_FP8's shape, with NaN bit patterns (0x7f, 0xff) in it."""
    kv = random_kv(SMALL_FP8, num_blocks, device, seed)
    kv.view(torch.uint8)[0, 0, 0, 0, 0, :2] = torch.tensor([0x7F, 0xFF], dtype=torch.uint8)
    return kv


def round_trip(tier, kv, owner=(3, 1), seed=0):
    """Swap every block out and back into other block ids; returns the tier job's bytes."""
    n = kv.shape[2]
    rng = random.Random(seed)
    src, dst = rng.sample(range(n), n), rng.sample(range(n), n)
    ids = tier.reserve(n)
    out = tier.wait(tier.submit_swap_out(kv, list(zip(src, ids)), owner))
    assert out.ok, out.error
    back = torch.zeros_like(kv)
    job = tier.wait(tier.submit_swap_in(back, list(zip(ids, dst)), owner))
    assert job.ok, job.error
    if kv.is_cuda:
        torch.cuda.synchronize()
    assert same_bytes(back[:, :, dst], kv[:, :, src])
    tier.free(ids)
    return out.nbytes


def test_a_float8_block_is_half_a_16_bit_block():
    assert SMALL_FP8.itemsize == 1 and SMALL.itemsize == 2
    assert 2 * SMALL_FP8.block_bytes == SMALL.block_bytes


def test_geometry_checks_the_scale_digest():
    with pytest.raises(ValueError, match="scale_digest"):
        KVGeometry(2, 2, 32, 16, "float16", scale_digest=OTHER_DIGEST)  # only float8 has one
    with pytest.raises(ValueError, match="scale_digest"):
        KVGeometry(2, 2, 32, 16, "float8_e4m3fn", scale_digest="not hex")
    with pytest.raises(ValueError, match="KVGeometry.dtype"):
        KVGeometry(2, 2, 32, 16, "float8_e5m2")


@pytest.mark.parametrize("kind", ["dram", *LAYOUTS])
def test_float8_round_trip_moves_half_the_bytes(kind, tmp_path):
    def tier_for(geometry, name):
        if kind == "dram":
            return make_tier(TierConfig(kv_offload="dram", num_tier_blocks=12), geometry)
        return make_tier(TierConfig(kv_offload="flash", flash_path=str(tmp_path / name),
                                    num_tier_blocks=12, flash_layout=kind), geometry)

    with tier_for(SMALL_FP8, "fp8.kvc") as fp8, tier_for(SMALL, "fp16.kvc") as fp16:
        fp8_bytes = round_trip(fp8, fp8_kv(10))
        fp16_bytes = round_trip(fp16, random_kv(SMALL, 10))
        assert fp8_bytes == 10 * SMALL_FP8.block_bytes and 2 * fp8_bytes == fp16_bytes
        assert fp8.stats()["swap_out_bytes"] == fp8.stats()["swap_in_bytes"] == fp8_bytes


def test_a_float8_tier_refuses_a_cache_of_another_dtype(flash):
    tier = flash(SMALL_FP8, num_blocks=4)
    ids = tier.reserve(1)
    with pytest.raises(ValueError, match="dtype"):
        tier.submit_swap_out(random_kv(SMALL, 2), [(0, ids[0])], (1, 1))


def test_the_superblock_carries_dtype_and_scales(flash, tmp_path):
    flash(SMALL_FP8, num_blocks=8).close()
    sb = read_superblock(tmp_path / "cache.kvc")
    assert (sb["dtype"], sb["scale_digest"], sb["version"]) == (
        "float8_e4m3fn", SMALL_FP8.scale_digest, 4)
    assert flash(SMALL_FP8, num_blocks=8).stats()["reused_file"]  # the same scales: reused


@pytest.mark.parametrize("other", [
    SMALL,  # written in float8, opened in float16
    KVGeometry(2, 2, 32, 16, "float8_e4m3fn", scale_digest=OTHER_DIGEST),  # other scales
], ids=["other-dtype", "other-scales"])
def test_a_file_of_other_dtype_or_scales_is_reinitialised_and_serves_nothing(flash, other):
    tier = flash(SMALL_FP8, num_blocks=8)
    hashes = [hashlib.sha256(b"block %d" % i).digest() for i in range(2)]
    job = tier.wait(tier.submit_prefix_write(fp8_kv(4), [(0, hashes[0]), (1, hashes[1])], SALT))
    assert job.ok and tier.lookup_prefix(hashes, SALT) == 2
    tier.close()
    moved = flash(other, num_blocks=8)
    assert not moved.stats()["reused_file"]
    assert moved.lookup_prefix(hashes, SALT) == 0  # even under the same salt
    assert moved.stats()["prefix_store_blocks"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["dram", "kvikio", "posix"])
def test_gpu_float8_round_trip_bit_exact(kind, tmp_path):
    if kind == "kvikio" and not kvikio_available():
        pytest.skip("kvikio not installed")
    if kind == "dram":
        config = TierConfig(kv_offload="dram", num_tier_blocks=48)
    else:
        config = TierConfig(kv_offload="flash", flash_path=str(tmp_path / "fp8.kvc"),
                            num_tier_blocks=48, flash_backend=kind, flash_chunk_mib=1)
    with make_tier(config, SMALL_FP8, device="cuda") as tier:
        kv = fp8_kv(40, device="cuda")
        assert round_trip(tier, kv) == 40 * SMALL_FP8.block_bytes
        round_trip(tier, kv, seed=1)
