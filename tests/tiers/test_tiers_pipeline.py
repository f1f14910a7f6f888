"""The flash tier's two-stage pipeline: buffer lending, stage order, errors, no deadlock."""
import concurrent.futures as cf
import os
import sys
import threading

import pytest
import torch

from hifc.tiers import KVGeometry, TierConfig, make_tier
from hifc.tiers.flash.io_base import HUGE_PAGE, aligned_empty, host_view
from hifc.tiers.flash.layout import ALIGN
from hifc.tiers.flash.pipeline import CPU, IO, PREP_NICE, ChunkPipeline, ChunkTask, cpu_stage_pool
from hifc.tiers.flash.staging import BufferPool
from tests.tiers.tier_helpers import random_kv


def test_buffer_pool_lends_at_once_then_in_arrival_order():
    pool = BufferPool(["a", "b"])
    got = []
    for name in ("first", "second", "third", "fourth"):
        pool.acquire(lambda buffers, name=name: got.append((name, buffers)))
    assert [name for name, _ in got] == ["first", "second"] and pool.num_free == 0
    pool.release(got[0][1])  # handed straight to the oldest waiter
    assert got[2] == ("third", got[0][1]) and pool.num_free == 0
    pool.release(got[1][1])
    assert got[3][0] == "fourth"
    pool.release("a")
    pool.release("b")
    assert pool.num_free == 2
    with pytest.raises(ValueError, match="at least one"):
        BufferPool([])


@pytest.fixture
def executors():
    io = cf.ThreadPoolExecutor(1, thread_name_prefix="test-io")
    cpu = cf.ThreadPoolExecutor(1, thread_name_prefix="test-cpu")
    yield io, cpu
    io.shutdown()
    cpu.shutdown()


def test_stages_run_in_order_on_their_pools(executors):
    pool = BufferPool(["buf"])
    seen = []

    def stage(tag):
        return lambda buffers: seen.append((tag, buffers, threading.current_thread().name))

    task = ChunkTask(pool, ((CPU, stage("prep")), (IO, stage("write")), (IO, stage("again")),
                            (CPU, stage("finish"))), nbytes=123)
    assert ChunkPipeline(*executors).submit(task).result(timeout=10) == 123
    assert [(tag, buf) for tag, buf, _ in seen] == [("prep", "buf"), ("write", "buf"),
                                                    ("again", "buf"), ("finish", "buf")]
    pools = [name.split("_")[0] for _, _, name in seen]
    assert pools == ["test-cpu", "test-io", "test-io", "test-cpu"]
    assert pool.num_free == 1


def test_a_failing_stage_skips_the_rest_and_returns_the_buffers(executors):
    pool = BufferPool(["buf"])
    later = []

    def boom(buffers):
        raise OSError(5, "boom")

    task = ChunkTask(pool, ((IO, boom), (CPU, later.append)), nbytes=1)
    future = ChunkPipeline(*executors).submit(task)
    with pytest.raises(OSError, match="boom"):
        future.result(timeout=10)
    assert later == [] and pool.num_free == 1


def test_more_chunks_than_buffers_in_both_directions_never_deadlock(tmp_path):
    """One I/O thread, one CPU thread, two buffer sets, swap-outs and swap-ins interleaved."""
    geometry = KVGeometry(2, 4, 128, 64, "float16")  # 64 KiB slices: 260 KiB records
    config = TierConfig(kv_offload="flash", flash_path=str(tmp_path / "c.kvc"), num_tier_blocks=64,
                        flash_chunk_mib=1, flash_io_threads=1,
                        flash_prep_threads=1)  # chunks of 3 blocks: 11 per job
    with make_tier(config, geometry) as tier:
        assert tier.stats()["chunk_blocks"] == 3
        kv = random_kv(geometry, 32)
        first = tier.reserve(32)
        assert tier.wait(tier.submit_swap_out(kv, list(zip(range(32), first)), (1, 0))).ok
        second = tier.reserve(32)
        back = torch.zeros_like(kv)
        jobs = [tier.submit_swap_in(back, list(zip(first, range(32))), (1, 0)),
                tier.submit_swap_out(kv, list(zip(range(31, -1, -1), second)), (2, 0))]
        for job in jobs:
            assert tier.wait(job, timeout=60).ok, job.error
        assert torch.equal(back, kv)
        back.zero_()
        assert tier.wait(tier.submit_swap_in(back, list(zip(second, range(31, -1, -1))),
                                             (2, 0))).ok
        assert torch.equal(back, kv)
        assert tier.stats()["prep_threads"] == 1


def test_prep_threads_are_checked(tmp_path):
    with pytest.raises(ValueError, match="prep_threads"):
        TierConfig(kv_offload="flash", flash_path=str(tmp_path / "c.kvc"), num_tier_blocks=4,
                   flash_prep_threads=0)


def test_large_host_buffers_are_huge_page_aligned_and_usable():
    big = aligned_empty(HUGE_PAGE + 3 * ALIGN, torch.device("cpu"))
    small = aligned_empty(5 * ALIGN, torch.device("cpu"))
    assert big.numel() == HUGE_PAGE + 3 * ALIGN and small.numel() == 5 * ALIGN
    assert big.data_ptr() % ALIGN == 0 and small.data_ptr() % ALIGN == 0
    big.fill_(7)
    view = host_view(big)
    assert view[0] == 7 and view[-1] == 7 and len(view) == big.numel()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_cpu_stage_threads_yield_to_io_threads_and_only_they():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    pool = cpu_stage_pool(1, "test-prep")
    try:
        nice = pool.submit(os.getpriority, os.PRIO_PROCESS, 0).result(timeout=10)
    finally:
        pool.shutdown()
    assert nice == min(19, before + PREP_NICE)
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # the caller's thread is untouched
