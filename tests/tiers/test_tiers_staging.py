"""Host staging decoupled from the work buffers where GPU caches are gathered and scattered: a
swap-out larger than the work buffers but within the host sets is staged whole while every
write is held; outputs and checksums are those of the host path; no buffer is ever lost.

The work-buffer path runs here on CPU tensors (``work_buffers=True``): the same stages, pools
and copies as for a GPU cache, with CPU memory in place of the GPU's."""
import argparse
import concurrent.futures as cf
import threading

import pytest
import torch

from hifc.config import EngineConfig, add_engine_args, engine_config_from_args
from hifc.tiers import ErrorKind, JobStatus, KVGeometry, TierConfig
from hifc.tiers.flash.pipeline import CPU, IO, WORK, ChunkPipeline, ChunkTask
from hifc.tiers.flash.staging import BufferPool, StagingBuffers
from tests.tiers.test_tiers_prefix import chain, load, same_bytes, store
from tests.tiers.test_tiers_staged import staged_until
from tests.tiers.tier_helpers import SMALL, gated, random_kv

GEOMETRY = KVGeometry(2, 4, 128, 64, "float16")  # 64 KiB slices: 260 KiB records


def assert_pools_full(tier, kv):
    staging = tier.mover.chunks.staging(kv.device)
    assert staging.sets.num_free == staging.sets.size
    if staging.work is not None:
        assert staging.work.num_free == staging.work.size


def test_a_stage_borrows_a_work_buffer_only_while_it_runs():
    """Four chunks, four host sets, one work buffer: every chunk's WORK stage runs (one at a
    time) while all writes wait at a gate; a fifth chunk waits for a host set."""
    sets = BufferPool([StagingBuffers(torch.zeros(8)) for _ in range(4)])
    work = BufferPool(["w"])
    gate, staged, lent = threading.Event(), [], []
    io, cpu = cf.ThreadPoolExecutor(4), cf.ThreadPoolExecutor(2)

    def task(n):
        def gather(buffers, work_buffer):
            lent.append(work_buffer)
            staged.append(n)

        return ChunkTask(sets, ((WORK, gather), (CPU, lambda buffers: None),
                                (IO, lambda buffers: gate.wait(10))), nbytes=n, work_pool=work)

    pipeline = ChunkPipeline(io, cpu)
    try:
        futures = [pipeline.submit(task(n)) for n in range(5)]
        for _ in range(1000):
            if len(staged) == 4:
                break
            threading.Event().wait(0.01)
        assert sorted(staged) == [0, 1, 2, 3] and lent == ["w"] * 4
        assert work.num_free == 1 and sets.num_free == 0 and not futures[4].done()
        gate.set()
        assert [f.result(timeout=10) for f in futures] == [0, 1, 2, 3, 4]
        assert sets.num_free == 4 and work.num_free == 1
    finally:
        gate.set()
        io.shutdown()
        cpu.shutdown()


def test_a_failing_work_stage_gives_both_buffers_back():
    sets = BufferPool([StagingBuffers(torch.zeros(8))])
    work = BufferPool(["w"])

    def boom(buffers, work_buffer):
        raise OSError(5, "boom")

    with cf.ThreadPoolExecutor(1) as io, cf.ThreadPoolExecutor(1) as cpu:
        future = ChunkPipeline(io, cpu).submit(
            ChunkTask(sets, ((WORK, boom), (IO, lambda buffers: None)), 1, work))
        with pytest.raises(OSError, match="boom"):
            future.result(timeout=10)
    assert sets.num_free == 1 and work.num_free == 1


def test_a_swap_out_larger_than_the_work_buffers_is_staged_while_writes_are_held(flash):
    tier = flash(num_blocks=16)
    # chunks of at most 2 blocks, 8 host sets, 1 work buffer: the whole swap-out fits the sets
    io = gated(tier, chunk_blocks=2, num_buffers=8, num_work_buffers=1, work_buffers=True)
    kv = random_kv(SMALL, 16)
    original = kv[:, :, :8].clone()
    job = tier.swap_out_blocks(kv, range(8), owner=(1, 0))
    staged = staged_until(tier, job, 8)
    assert sorted(staged) == list(range(8)) and not job.done and tier.poll() == []
    staging = tier.mover.chunks.staging(kv.device)
    assert staging.work.num_free == 1  # given back after each copy, the writes still held
    kv[:, :, :8] = 0  # the caller reuses every staged block while they are being written
    io.gate.set()
    assert tier.wait(job).ok and tier.take_staged(job) == []
    back = tier.wait(tier.submit_swap_in(kv, list(zip(job.tier_blocks, range(8, 16))),
                                         owner=(1, 0)))
    assert back.ok and torch.equal(kv[:, :, 8:16], original)
    assert_pools_full(tier, kv)


@pytest.mark.parametrize("layout", ["block-record", "layer-kv"])
def test_work_buffer_path_writes_the_host_paths_records(flash, layout):
    """The same blocks swapped out through work buffers and through the host path give the
    same file bytes (data, checksums, headers) and read back the same."""
    kv = random_kv(GEOMETRY, 12)
    src = [9, 3, 4, 5, 0, 11, 7]
    files = []
    for name, work_buffers in (("host.kvc", None), ("work.kvc", True)):
        tier = flash(GEOMETRY, name=name, num_blocks=16, layout=layout, prefix_store="off")
        tier.mover.chunks = type(tier.mover.chunks)(
            tier.layout, tier.io, 7, 3, num_buffers=4, num_work_buffers=1,
            work_buffers=work_buffers)  # the same epoch: the same record headers
        ids = tier.reserve(len(src))
        assert tier.wait(tier.submit_swap_out(kv, list(zip(src, ids)), (1, 0))).ok
        files.append((tier, ids))
        back = torch.zeros_like(kv)
        assert tier.wait(tier.submit_swap_in(back, list(zip(ids, range(len(src)))),
                                             (1, 0))).ok
        assert torch.equal(back[:, :, :len(src)], kv[:, :, src])
    (host_tier, host_ids), (work_tier, work_ids) = files
    assert host_ids == work_ids
    with open(host_tier.cache_file.path, "rb") as a, open(work_tier.cache_file.path, "rb") as b:
        plan = host_tier.layout.chunk_plan(0, 16)
        for file_offset, _, length in plan.runs:  # every byte of the records' runs
            a.seek(file_offset)
            b.seek(file_offset)
            assert a.read(length) == b.read(length)


def test_a_corrupt_record_never_reaches_the_cache_through_a_work_buffer(flash):
    tier = flash(GEOMETRY, num_blocks=16, fault_injection=True, prefix_store="off")
    gated(tier, chunk_blocks=4, num_buffers=4, work_buffers=True).gate.set()
    kv = random_kv(GEOMETRY, 8)
    ids = tier.reserve(4)
    assert tier.wait(tier.submit_swap_out(kv, list(zip(range(4), ids)), (1, 0))).ok
    tier.faults.arm("read", "bitflip", byte_offset=4096 * 3 + 7)
    back = torch.zeros_like(kv)
    job = tier.wait(tier.submit_swap_in(back, list(zip(ids, range(4, 8))), (1, 0)))
    assert job.status is JobStatus.FAILED and job.error_kind is ErrorKind.INTEGRITY
    assert_pools_full(tier, kv)


def test_no_buffer_leaks_after_many_swaps_and_failures(flash):
    tier = flash(num_blocks=32, fault_injection=True, prefix_store="off")
    gated(tier, chunk_blocks=2, num_buffers=3, num_work_buffers=1,
          work_buffers=True).gate.set()
    kv = random_kv(SMALL, 16)
    back = torch.zeros_like(kv)
    outcomes = []
    for round_ in range(12):
        n = 1 + round_ % 8
        if round_ % 4 == 1:
            tier.faults.arm("write", "eio", skip=round_ % 3)
        elif round_ % 4 == 3:
            tier.faults.arm("read", "short")
        ids = tier.reserve(n)
        out = tier.wait(tier.submit_swap_out(kv, list(zip(range(n), ids)), (round_, 0)))
        if out.ok:
            job = tier.wait(tier.submit_swap_in(back, list(zip(ids, range(n))), (round_, 0)))
            outcomes.append(job.ok)
            if job.ok:
                assert torch.equal(back[:, :, :n], kv[:, :, :n])
        else:
            outcomes.append(False)
        tier.faults.clear()
        tier.free(ids)
        assert_pools_full(tier, kv)
    assert True in outcomes and False in outcomes
    assert tier.num_free_blocks == 32


def flash_config(tmp_path, **options) -> TierConfig:
    return TierConfig(kv_offload="flash", flash_path=str(tmp_path / "c.kvc"), num_tier_blocks=64,
                      **options)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "64", (1 << 20) + 1])
def test_staging_mib_is_checked(tmp_path, bad):
    with pytest.raises(ValueError, match="flash_staging_mib must be an integer"):
        flash_config(tmp_path, flash_staging_mib=bad)


def test_staging_mib_is_an_engine_option_and_a_flag(tmp_path):
    config = EngineConfig.from_options("random:tiny-llama", kv_offload="flash",
                                       flash_path=str(tmp_path / "c.kvc"), num_tier_blocks=8,
                                       flash_staging_mib=64)
    assert config.tier.flash_staging_mib == 64 and config.options()["flash_staging_mib"] == 64
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--kv-offload", "flash", "--flash-path", str(tmp_path / "c.kvc"),
                              "--flash-size-gib", "0.01", "--flash-staging-mib", "256"])
    assert engine_config_from_args(args).tier.flash_staging_mib == 256
    assert TierConfig().flash_staging_mib == 1024


@pytest.mark.parametrize("staging_mib, sets", [(1, 2), (4, 5), (1024, 24)])
def test_staging_mib_sets_the_host_sets(flash, staging_mib, sets):
    """Chunks of 3 records of 260 KiB (780 KiB a set): as many sets as fit, at least one per
    I/O and prep thread, at most enough for the whole tier (22 chunks + the ramp's 2)."""
    tier = flash(GEOMETRY, num_blocks=64, chunk_mib=1, io_threads=1, prep_threads=1,
                 staging_mib=staging_mib)
    stats = tier.stats()
    assert stats["chunk_blocks"] == 3 and stats["staging_sets"] == sets
    assert stats["staging_host_bytes"] == sets * 780 * 1024
    assert stats["staging_work_bytes"] == 0  # a CPU cache: gathered into the host sets


def test_prefix_blocks_round_trip_through_work_buffers(flash):
    """Prefix writes (whose first, WORK, stage is guarded against a closing tier) and reads."""
    tier = flash(num_blocks=16)
    gated(tier, chunk_blocks=2, num_buffers=4, num_work_buffers=1, work_buffers=True).gate.set()
    kv = random_kv(SMALL, 6)
    hashes = chain(5)
    store(tier, kv, [4, 0, 1, 2, 5], hashes)
    job, back = load(tier, hashes)
    assert job.ok and same_bytes(back[:, :, :5], kv[:, :, [4, 0, 1, 2, 5]])
    assert_pools_full(tier, kv)
