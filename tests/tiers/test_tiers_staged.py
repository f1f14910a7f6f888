"""A swap-out reports its blocks staged (copied out of the KV cache into the tier's memory)
before its write ends: the caller may reuse those KV cache blocks at once, the records still
hold the data, and a write that fails after staging still fails the job."""
import time

import torch

from hifc.tiers import DramTier, ErrorKind, JobStatus
from tests.tiers.tier_helpers import SMALL, gated, random_kv


def staged_until(tier, job, count: int) -> list[int]:
    """Take the job's staged pairs until ``count`` have come (``wait_progress`` between)."""
    staged: list[int] = []
    for _ in range(50):
        staged += tier.take_staged(job)
        if len(staged) >= count:
            break
        tier.wait_progress(timeout=1.0)
    return staged


def test_blocks_are_staged_chunk_by_chunk_while_the_write_is_held(flash):
    tier = flash(num_blocks=16)
    # chunks of at most 2 blocks (the first one 1), two staging buffer sets
    io = gated(tier, chunk_blocks=2, num_buffers=2)
    kv = random_kv(SMALL, 16)
    original = kv[:, :, :8].clone()
    job = tier.swap_out_blocks(kv, range(8), owner=(1, 0))
    staged = staged_until(tier, job, 3)
    # chunks [0], [1, 2] fill both buffer sets; the others wait for a set, held by the writes
    assert sorted(staged) == [0, 1, 2] and not job.done and tier.poll() == []
    kv[:, :, :3] = 0  # the caller reuses the staged blocks while they are being written
    io.gate.set()
    assert sorted(staged + staged_until(tier, job, 5)) == list(range(8))
    assert tier.wait(job).ok and tier.take_staged(job) == []
    back = tier.wait(tier.submit_swap_in(kv, list(zip(job.tier_blocks, range(8, 16))),
                                         owner=(1, 0)))
    assert back.ok and torch.equal(kv[:, :, 8:16], original)


def test_a_write_that_fails_after_staging_fails_the_job(flash):
    tier = flash(num_blocks=8, fault_injection=True)
    tier.faults.arm("write", "eio", times=8)
    io = gated(tier, chunk_blocks=4, num_buffers=4)
    kv = random_kv(SMALL, 4)
    job = tier.swap_out_blocks(kv, range(4), owner=(1, 0))
    assert sorted(staged_until(tier, job, 4)) == [0, 1, 2, 3] and not job.done
    io.gate.set()
    tier.wait(job)
    assert job.status is JobStatus.FAILED and job.error_kind is ErrorKind.IO_ERROR
    assert tier.take_staged(job) == []
    tier.free(job.tier_blocks)
    assert tier.num_free_blocks == 8


def test_wait_progress_returns_when_a_job_ends():
    tier = DramTier(SMALL, 4)
    kv = random_kv(SMALL, 2)
    job = tier.swap_out_blocks(kv, [0, 1], owner=(1, 0))
    tier.wait_progress(timeout=10.0)
    assert tier.poll() == [job] and job.ok
    assert tier.take_staged(job) == []  # the DRAM copy ends the job: nothing staged before
    tier.close()


class StagingPeers:
    """Another tensor-parallel rank as the tier sees it (``TierPeers``), driven by the test:
    it has staged ``staged_pairs`` of every swap-out and ends a job once ``ended`` says."""

    size = 2

    def __init__(self):
        self.staged_pairs: set[int] = set()
        self.ended = False
        self.jobs: set[int] = set()

    def launch(self, order):
        self.jobs.add(order.job_id)

    def collect(self):
        pass

    def request_wait(self, job_id, timeout):
        pass

    def tracks(self, job_id):
        return job_id in self.jobs

    def is_done(self, job_id):
        return self.ended

    def staged(self, job_id):
        return set(self.staged_pairs)

    def pop(self, job_id):
        self.jobs.discard(job_id)
        return []

    def cancel_queued(self):
        pass

    def close(self):
        pass


def test_with_other_ranks_a_block_is_free_once_every_rank_staged_it(flash):
    tier = flash(num_blocks=16)
    tier.peers = peers = StagingPeers()
    io = gated(tier, chunk_blocks=4, num_buffers=4)
    kv = random_kv(SMALL, 4)
    job = tier.swap_out_blocks(kv, range(4), owner=(1, 0))
    for _ in range(500):  # this rank stages all four blocks (the writes are held)
        if len(job._staged) == 4:
            break
        time.sleep(0.01)
    assert job._staged == {0, 1, 2, 3}
    assert tier.take_staged(job) == []  # the other rank has staged none of them yet
    peers.staged_pairs = {1, 2}
    assert tier.take_staged(job) == [1, 2]
    peers.staged_pairs = {0, 1, 2, 3}
    assert tier.take_staged(job) == [0, 3] and tier.take_staged(job) == []
    io.gate.set()
    tier.wait(job, timeout=10.0)
    assert not job.done  # this rank's write ended, the other rank's not yet
    peers.ended = True
    assert tier.wait(job).ok and tier.take_staged(job) == []


def test_a_worker_rank_reports_its_staged_blocks_until_the_job_ends(flash):
    from hifc.tiers.jobs import IOOrder
    from hifc.tiers.rank_jobs import RankJobs

    tier = flash(num_blocks=16)
    io = gated(tier, chunk_blocks=4, num_buffers=4)
    kv = random_kv(SMALL, 4)
    jobs = RankJobs(1, tier.mover, kv)
    jobs.start(IOOrder(7, "swap_out", tuple((i, 8 + i) for i in range(4)), (1, 0)))
    staged: list[int] = []
    for _ in range(500):
        report = jobs.report()
        assert report.outcomes == []  # the writes are held
        staged += report.staged.get(7, [])
        if len(staged) == 4:
            break
        time.sleep(0.01)
    assert sorted(staged) == [0, 1, 2, 3]  # each pair reported once
    io.gate.set()
    jobs.wait(7, timeout=10.0)
    report = jobs.report()
    assert [(o.job_id, o.error) for o in report.outcomes] == [(7, None)] and report.staged == {}
