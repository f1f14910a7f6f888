import errno
import random

import pytest
import torch

from hifc.tiers import KVGeometry, TierConfig, make_tier
from hifc.tiers.flash.io_base import FileIO, IOPriority
from hifc.tiers.flash.layout import ALIGN, LAYOUTS
from hifc.tiers.flash.chunks import ChunkMover
from tests.tiers.tier_helpers import SMALL, SMALL_FP8, random_kv

GEOMETRIES = [
    KVGeometry(2, 2, 32, 16, "float16"),  # 2 KiB slices
    SMALL_FP8,  # 1 KiB slices, padded
    KVGeometry(3, 1, 5, 3, "bfloat16"),  # 30-byte slices, padded
    KVGeometry(2, 4, 64, 32, "float32"),  # 32 KiB slices
    KVGeometry(1, 2, 64, 64, "bfloat16"),  # 16 KiB slices, one layer
]


def round_trip(tier, kv, src, dst, owner=(3, 1)):
    ids = tier.reserve(len(src))
    out = tier.wait(tier.submit_swap_out(kv, list(zip(src, ids)), owner))
    assert out.ok, out.error
    back = torch.full_like(kv, -7)
    job = tier.wait(tier.submit_swap_in(back, list(zip(ids, dst)), owner))
    assert job.ok, job.error
    assert torch.equal(back[:, :, dst].view(torch.uint8), kv[:, :, src].view(torch.uint8))
    untouched = sorted(set(range(kv.shape[2])) - set(dst))
    assert (back[:, :, untouched] == -7).all()
    tier.free(ids)
    return ids


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g.dtype}-{g.slice_bytes}B")
def test_bit_exact_round_trip(flash, layout, geometry):
    tier = flash(geometry, layout=layout, num_blocks=24, chunk_mib=1, io_threads=3)
    kv = random_kv(geometry, 20)
    kv.view(torch.uint8)[0, 0, 0, 0, 0, :2] = 0xFF  # NaN bit patterns survive bit-exactly
    rng = random.Random(0)
    src = rng.sample(range(20), 12)
    dst = rng.sample(range(20), 12)  # different GPU ids on the way back
    round_trip(tier, kv, src, dst)
    round_trip(tier, kv, list(range(20)), list(range(20)))  # one coalesced extent
    assert tier.num_free_blocks == tier.num_blocks


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_across_wrap_and_chunks(flash, layout):
    geometry = KVGeometry(2, 8, 64, 32, "float16")  # 32 KiB slices, 132 KiB per record
    tier = flash(geometry, layout=layout, num_blocks=40, chunk_mib=1, io_threads=4)
    kv = random_kv(geometry, 30, seed=5)
    tier.free(tier.reserve(25))  # move the append head near the end
    ids = round_trip(tier, kv, list(range(30)), list(range(29, -1, -1)))
    assert ids == list(range(25, 40)) + list(range(15))  # wrapped at the end of the file
    stats = tier.stats()
    assert stats["allocator"]["wraps"] == 1 and stats["allocator"]["backward_jumps"] == 0


def test_scattered_blocks_in_one_chunk(flash):
    """More runs of GPU ids in one chunk than slice copies are worth: one index kernel."""
    geometry = KVGeometry(1, 1, 16, 16, "float32")  # 1 KiB slices
    tier = flash(geometry, num_blocks=64, chunk_mib=1)
    kv = random_kv(geometry, 48, seed=3)
    perm = random.Random(3).sample(range(48), 48)
    round_trip(tier, kv, perm, list(reversed(perm)))


class RecordingIO(FileIO):
    """Wraps a backend and records every I/O's offset, length and buffer address."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.name, self.direct = inner, "recording", inner.direct
        self.ios = []

    def staging_device(self, kv_device):
        return self.inner.staging_device(kv_device)

    def write(self, buf, file_offset, priority=IOPriority.SWAP_OUT):
        self.ios.append(("w", file_offset, buf.numel(), buf.data_ptr()))
        return self.inner.write(buf, file_offset, priority)

    def read(self, buf, file_offset, priority=IOPriority.SWAP_IN):
        self.ios.append(("r", file_offset, buf.numel(), buf.data_ptr()))
        return self.inner.read(buf, file_offset, priority)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_io_is_aligned(flash, layout):
    geometry = KVGeometry(3, 1, 5, 3, "bfloat16")
    tier = flash(geometry, layout=layout, num_blocks=16, chunk_mib=1)
    spy = RecordingIO(tier.io)
    tier.mover.chunks = ChunkMover(tier.layout, spy, tier.epoch, 4, num_buffers=2)
    kv = random_kv(geometry, 12)
    round_trip(tier, kv, [5, 1, 2, 3, 9, 0], [0, 1, 2, 3, 4, 5])
    assert spy.ios
    for op, offset, length, address in spy.ios:
        assert offset % ALIGN == 0 and length % ALIGN == 0 and address % ALIGN == 0
    runs_per_chunk = 1 if layout == "block-record" else 2 * geometry.num_layers + 1
    writes = [io for io in spy.ios if io[0] == "w"]
    # tier ids 0..5, chunks of <= 4 blocks, a job's first and last chunk of 4 // 4 = 1 block:
    # ids 0, 1..4 and 5 are three coalesced chunks
    assert len(writes) == 3 * runs_per_chunk


def test_dram_tier_round_trip_and_same_interface():
    geometry = KVGeometry(2, 2, 16, 8, "bfloat16")
    tier = make_tier(TierConfig(kv_offload="dram", num_tier_blocks=16), geometry)
    kv = random_kv(geometry, 10)
    round_trip(tier, kv, [9, 3, 4], [0, 1, 2])
    assert tier.stats()["kind"] == "dram" and tier.num_free_blocks == 16
    tier.close()


def test_size_gib_sets_block_count(tmp_path):
    geometry = KVGeometry(2, 2, 64, 64, "float16")  # 64 KiB per block + 4 KiB header
    config = TierConfig(kv_offload="flash", flash_path=str(tmp_path / "c.kvc"),
                        flash_size_gib=1 / 1024)  # 1 MiB
    with make_tier(config, geometry) as tier:
        assert tier.num_blocks == (2**20 - 4096) // (68 * 1024)
    with pytest.raises(ValueError, match="holds no block"):
        make_tier(TierConfig(kv_offload="flash", flash_path=str(tmp_path / "d.kvc"),
                             flash_size_gib=1e-6), geometry)


def test_odirect_refused_falls_back_to_buffered(monkeypatch, tmp_path):
    import os

    from hifc.tiers.flash import posix_io

    real = posix_io.reopen

    def refuse_direct(control_fd, path, flags):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(control_fd, path, flags)

    monkeypatch.setattr(posix_io, "reopen", refuse_direct)
    with make_tier(TierConfig(kv_offload="flash", flash_path=str(tmp_path / "c.kvc"),
                              num_tier_blocks=8), SMALL) as tier:
        stats = tier.stats()
        assert stats["direct_io"] is False
        assert "falling back to buffered" in " ".join(stats["io_notes"])
        round_trip(tier, random_kv(SMALL, 4), [0, 1, 2], [2, 1, 0])


def test_tmpfs_or_disk_either_works():
    """/dev/shm is tmpfs: O_DIRECT may or may not be accepted there; the tier works both ways."""
    import os
    import tempfile
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        config = TierConfig(kv_offload="flash", flash_path=os.path.join(d, "c.kvc"),
                            num_tier_blocks=8)
        with make_tier(config, SMALL) as tier:
            notes = " ".join(tier.stats()["io_notes"])
            assert ("O_DIRECT in effect" in notes) == tier.stats()["direct_io"]
            round_trip(tier, random_kv(SMALL, 4), [0, 1], [1, 0])
