"""KVSwapper's stall accounting: a blocking collect waits for the oldest job, and the wait is
attributed to swap-outs only when that job is one (a fake tier and a fake clock, no timing)."""
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
    """Jobs finish only when waited for; each wait takes `wait_s` on the fake clock."""

    def __init__(self, clock, wait_s):
        self.clock, self.wait_s, self.next_id = clock, wait_s, 0
        self.stalling = False

    @contextmanager
    def stalled(self):
        self.stalling = True
        yield
        self.stalling = False

    def _job(self, op, pairs, owner):
        self.next_id += 1
        return Job(self.next_id, op, tuple(pairs), owner)

    def submit_swap_out(self, kv_cache, pairs, owner):
        return self._job("swap_out", pairs, owner)

    def submit_swap_in(self, kv_cache, pairs, owner):
        return self._job("swap_in", pairs, owner)

    def poll(self):
        return []

    def wait(self, job, timeout=None):
        assert self.stalling  # the swapper tells the tier that the engine waits
        self.clock.now += self.wait_s
        job.status = JobStatus.OK
        return job


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
