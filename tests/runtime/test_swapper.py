"""KVSwapper's stall accounting: a blocking collect waits for the next job to end or stage
blocks, and the wait is attributed to swap-outs only when the oldest job is one (a fake tier
and a fake clock, no timing)."""
from contextlib import contextmanager

from hifc.core.scheduler import SchedulerOutput, SwapOrder
from hifc.runtime import swapper as swapper_mod
from hifc.runtime.swapper import KVSwapper
from hifc.tiers.jobs import Job, JobStatus


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeTier:
    """Jobs end one at a time, oldest first, only when the engine waits; each wait takes
    `wait_s` on the fake clock. With `staged`, a swap-out's first wait stages its pairs
    instead (the job goes on)."""

    def __init__(self, clock, wait_s, staged=False):
        self.clock, self.wait_s, self.next_id = clock, wait_s, 0
        self.stage_first = staged
        self.stalling = False
        self.pending, self.ended = [], []

    @contextmanager
    def stalled(self):
        self.stalling = True
        yield
        self.stalling = False

    def _job(self, op, pairs, owner):
        self.next_id += 1
        job = Job(self.next_id, op, tuple(pairs), owner)
        self.pending.append(job)
        return job

    def submit_swap_out(self, kv_cache, pairs, owner):
        return self._job("swap_out", pairs, owner)

    def submit_swap_in(self, kv_cache, pairs, owner):
        return self._job("swap_in", pairs, owner)

    def poll(self):
        ended, self.ended = self.ended, []
        return ended

    def take_staged(self, job):
        staged, job._staged = job._staged, []
        return staged

    def wait_progress(self, timeout=None):
        assert self.stalling  # the swapper tells the tier that the engine waits
        self.clock.now += self.wait_s
        job = self.pending[0]
        if self.stage_first and job.op == "swap_out" and not job._staged:
            job._staged = list(range(len(job.pairs)))
            self.stage_first = False
            return
        job.status = JobStatus.OK
        self.ended.append(self.pending.pop(0))


def test_blocking_on_a_swap_out_counts_as_swap_out_stall(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(swapper_mod.time, "perf_counter", clock)
    swapper = KVSwapper(FakeTier(clock, wait_s=0.25), kv_cache=None)
    out = SchedulerOutput(scheduled=[], swap_out=[SwapOrder("a", (0, 1), [(3, 0)])],
                          swap_in=[SwapOrder("b", (0, 2), [(5, 4)])])
    assert swapper.submit(out) == []  # nothing finished at once
    first = swapper.collect(block=True)  # the oldest job is the swap-out
    assert [(r.request_id, r.op) for r in first] == [("a", "swap_out")]
    assert swapper.stall_seconds == 0.25 and swapper.swap_out_stall_seconds == 0.25
    second = swapper.collect(block=True)  # then the swap-in: stall, but not swap-out stall
    assert [(r.request_id, r.op) for r in second] == [("b", "swap_in")]
    assert swapper.stall_seconds == 0.5 and swapper.swap_out_stall_seconds == 0.25
    assert swapper.collect(block=True) == [] and swapper.stall_seconds == 0.5  # none pending


def test_a_swap_out_reports_its_staged_blocks_before_it_ends(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(swapper_mod.time, "perf_counter", clock)
    swapper = KVSwapper(FakeTier(clock, wait_s=0.25, staged=True), kv_cache=None)
    swapper.submit(SchedulerOutput(scheduled=[], swap_out=[
        SwapOrder("a", (0, 1), [(3, 0), (4, 1)])]))
    staged = swapper.collect(block=True)  # the wait ends when the blocks are staged
    assert [(r.request_id, r.op, r.staged) for r in staged] == [("a", "swap_out_staged", (0, 1))]
    assert swapper.num_pending == 1 and swapper.swap_out_stall_seconds == 0.25
    assert swapper.collect(block=False) == []  # each staged pair is reported once
    done = swapper.collect(block=True)
    assert [(r.request_id, r.op, r.ok) for r in done] == [("a", "swap_out", True)]
    assert swapper.num_pending == 0 and swapper.swap_out_stall_seconds == 0.5
