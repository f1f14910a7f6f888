"""The flash device arbiter: priority order, fair turns between replicas, the in-flight budget,
its metrics, and the tier's I/O going through it. No timing assertions: order is checked with
I/Os that each fill the whole budget (so they run one at a time), metrics with a fake clock."""
from __future__ import annotations

import hashlib
import threading
import time

import pytest
import torch

from hifc.tiers import TierConfig, make_tier
from hifc.tiers.flash.arbiter import DeviceArbiter, DeviceShare
from hifc.tiers.flash.io_base import FileIO, IOPriority
from tests.tiers.tier_helpers import SMALL, random_kv

WINDOW = 100


def wait_until(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def start_waiters(arbiter, requests, order):
    """One thread per (name, replica, nbytes, priority): acquire, note its name, release."""
    def run(name, replica, nbytes, priority):
        with arbiter.grant(replica, nbytes, priority):
            order.append(name)

    threads = []
    for name, replica, nbytes, priority in requests:
        before = sum(arbiter.waiting().values())
        thread = threading.Thread(target=run, args=(name, replica, nbytes, priority))
        thread.start()
        wait_until(lambda: sum(arbiter.waiting().values()) == before + 1, f"{name} to queue")
        threads.append(thread)
    return threads


def join_all(threads):
    for thread in threads:
        thread.join(20)
        assert not thread.is_alive()


def test_swap_ins_go_before_swap_outs_before_prefix_writes():
    arbiter = DeviceArbiter("test", 2, WINDOW)
    arbiter.acquire(0, WINDOW, IOPriority.SWAP_OUT)  # the device is busy
    order: list[str] = []
    threads = start_waiters(arbiter, [  # queued least urgent first
        ("prefix", 1, WINDOW, IOPriority.PREFIX_WRITE),
        ("out", 1, WINDOW, IOPriority.SWAP_OUT),
        ("in", 0, WINDOW, IOPriority.SWAP_IN)], order)
    assert arbiter.waiting() == {"swap_in": 1, "swap_out": 1, "prefix_write": 1}
    arbiter.release(0, WINDOW)
    join_all(threads)
    assert order == ["in", "out", "prefix"]


def test_a_stalled_replicas_io_goes_first():
    arbiter = DeviceArbiter("test", 3, WINDOW)
    arbiter.acquire(2, WINDOW, IOPriority.SWAP_OUT)
    order: list[str] = []
    threads = start_waiters(arbiter, [("in of 1", 1, WINDOW, IOPriority.SWAP_IN),
                                      ("out of 0", 0, WINDOW, IOPriority.SWAP_OUT)], order)
    with arbiter.stall(0):  # replica 0's engine has nothing to run until its write is done
        assert arbiter.stats()["stalled_replicas"] == 1
        arbiter.release(2, WINDOW)
        join_all(threads)
    assert order == ["out of 0", "in of 1"]
    assert arbiter.stats()["stalled_replicas"] == 0


def test_replicas_take_turns_within_a_priority():
    arbiter = DeviceArbiter("test", 3, WINDOW)
    arbiter.acquire(2, WINDOW, IOPriority.SWAP_OUT)
    order: list[int] = []
    # replica 0 queues a burst of three writes before replica 1 queues its three
    threads = start_waiters(arbiter, [(0, 0, WINDOW, IOPriority.SWAP_OUT)] * 3
                            + [(1, 1, WINDOW, IOPriority.SWAP_OUT)] * 3, order)
    arbiter.release(2, WINDOW)
    join_all(threads)
    assert [set(order[i:i + 2]) for i in (0, 2, 4)] == [{0, 1}] * 3


def test_a_replica_back_from_idle_gets_no_credit_for_it():
    arbiter = DeviceArbiter("test", 2, WINDOW)
    for _ in range(5):  # replica 0 alone uses the device for a while
        with arbiter.grant(0, WINDOW, IOPriority.SWAP_OUT):
            pass
    arbiter.acquire(0, WINDOW, IOPriority.SWAP_OUT)
    order: list[int] = []
    threads = start_waiters(arbiter, [(1, 1, WINDOW, IOPriority.SWAP_OUT)] * 4
                            + [(0, 0, WINDOW, IOPriority.SWAP_OUT)] * 2, order)
    arbiter.release(0, WINDOW)
    join_all(threads)
    # credited with its idle time, replica 1 would run all four before replica 0's next
    assert 0 in order[:3], order


def test_ios_share_the_budget_and_a_large_one_runs_alone():
    arbiter = DeviceArbiter("test", 2, WINDOW)
    arbiter.acquire(0, 40, IOPriority.SWAP_OUT)
    arbiter.acquire(1, 40, IOPriority.SWAP_IN)  # 80 of 100 in flight: both admitted at once
    order: list[str] = []
    threads = start_waiters(arbiter, [("third", 1, 40, IOPriority.SWAP_IN)], order)
    assert order == []  # 120 would exceed the budget
    arbiter.release(0, 40)
    join_all(threads)
    arbiter.release(1, 40)
    assert order == ["third"]
    with arbiter.grant(0, 10 * WINDOW, IOPriority.SWAP_OUT):  # nothing in flight: admitted
        assert arbiter.stats()["inflight_bytes"] == 10 * WINDOW
    assert arbiter.stats()["inflight_bytes"] == 0


def test_forget_frees_what_a_dead_replica_held():
    arbiter = DeviceArbiter("test", 2, WINDOW)
    arbiter.acquire(0, WINDOW, IOPriority.SWAP_OUT)  # replica 0 then dies holding it
    order: list[str] = []
    threads = start_waiters(arbiter, [("survivor", 1, WINDOW, IOPriority.SWAP_IN)], order)
    arbiter.forget(0)
    join_all(threads)
    assert order == ["survivor"]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_metrics_per_replica_and_device_with_a_fake_clock():
    clock = FakeClock()
    arbiter = DeviceArbiter("8:16", 2, 2 << 30, clock=clock)
    arbiter.acquire(0, 1 << 30, IOPriority.SWAP_OUT)
    clock.now += 0.5
    arbiter.release(0, 1 << 30)  # 1 GiB in 0.5 s of busy device
    clock.now += 10  # idle time does not count
    arbiter.acquire(0, 2 << 30, IOPriority.SWAP_OUT)
    order: list[str] = []
    threads = start_waiters(arbiter, [("in", 1, 1 << 30, IOPriority.SWAP_IN)], order)
    clock.now += 1.5
    arbiter.release(0, 2 << 30)
    join_all(threads)
    stats = arbiter.stats()
    assert stats["measured_gibps"] == pytest.approx(4 / 2.0)  # 4 GiB over 2 busy seconds
    assert stats["swap_out_bytes"] == 3 << 30 and stats["swap_in_bytes"] == 1 << 30
    assert stats["swap_in_waits"] == 1 and stats["swap_in_wait_seconds"] == pytest.approx(1.5)
    assert arbiter.replica_stats(1) == {
        "swap_in_bytes": 1 << 30, "swap_in_waits": 1, "swap_in_wait_seconds": 1.5,
        "swap_out_bytes": 0, "swap_out_waits": 0, "swap_out_wait_seconds": 0.0,
        "prefix_write_bytes": 0, "prefix_write_waits": 0, "prefix_write_wait_seconds": 0.0}
    assert arbiter.replica_stats(0)["swap_out_bytes"] == 3 << 30
    with pytest.raises(ValueError, match="replica 2 out of range"):
        arbiter.replica_stats(2)


class RecordingIO(FileIO):
    name = "recording"

    def __init__(self):
        super().__init__()
        self.calls = []

    def staging_device(self, kv_device):
        return torch.device("cpu")

    def write(self, buf, file_offset, priority=IOPriority.SWAP_OUT):
        self.calls.append(("write", buf.numel(), priority))
        return buf.numel()

    def read(self, buf, file_offset, priority=IOPriority.SWAP_IN):
        self.calls.append(("read", buf.numel(), priority))
        return buf.numel()


def test_arbitrated_io_admits_each_call_at_its_priority():
    arbiter = DeviceArbiter("test", 2, WINDOW)
    inner = RecordingIO()
    io = DeviceShare(arbiter, 1).wrap(inner)
    buf = torch.zeros(64, dtype=torch.uint8)
    assert io.write(buf, 0) == 64 and io.read(buf, 0) == 64
    assert io.write(buf, 0, IOPriority.PREFIX_WRITE) == 64
    assert inner.calls == [("write", 64, IOPriority.SWAP_OUT), ("read", 64, IOPriority.SWAP_IN),
                           ("write", 64, IOPriority.PREFIX_WRITE)]
    stats = arbiter.replica_stats(1)
    assert (stats["swap_out_bytes"], stats["swap_in_bytes"], stats["prefix_write_bytes"]) \
        == (64, 64, 64)
    assert io.name == "recording+arbiter"


def test_flash_tier_swaps_and_prefix_writes_go_through_the_arbiter(tmp_path):
    arbiter = DeviceArbiter("test", 2, 1 << 20)
    config = TierConfig(kv_offload="flash", flash_path=str(tmp_path / "a.kvc"),
                        num_tier_blocks=8)
    with make_tier(config, SMALL, device_share=DeviceShare(arbiter, 0)) as tier:
        kv = random_kv(SMALL, 4)
        out = tier.wait(tier.swap_out_blocks(kv, [0, 1, 2], owner=(1, 0)))
        back = torch.zeros_like(kv)
        pairs = [(t, g) for (_, t), g in zip(out.pairs, [3, 2, 1])]
        assert tier.wait(tier.submit_swap_in(back, pairs, owner=(1, 0))).ok
        assert torch.equal(back[:, :, [3, 2, 1]], kv[:, :, [0, 1, 2]])
        with tier.stalled():  # what the engine enters when it waits for the tier
            assert arbiter.stats()["stalled_replicas"] == 1
        stats = arbiter.replica_stats(0)
        assert stats["swap_out_bytes"] >= 3 * SMALL.block_bytes  # records add headers
        assert stats["swap_in_bytes"] == stats["swap_out_bytes"]
        assert stats["prefix_write_bytes"] == 0
        hashes = [hashlib.sha256(b"block %d" % i).digest() for i in range(2)]
        salt = hashlib.sha256(b"model").digest()
        assert tier.wait(tier.submit_prefix_write(kv, [(0, hashes[0]), (1, hashes[1])],
                                                  salt)).ok
        assert arbiter.replica_stats(0)["prefix_write_bytes"] >= 2 * SMALL.block_bytes
    assert arbiter.stats()["inflight_bytes"] == 0


def _replica_process(arbiter: DeviceArbiter, replica: int, count: int) -> None:
    for _ in range(count):
        with arbiter.grant(replica, WINDOW // 2, IOPriority.SWAP_OUT):
            pass


def test_replica_processes_share_one_arbiter():
    ctx = torch.multiprocessing.get_context("spawn")
    arbiter = DeviceArbiter("test", 2, WINDOW, ctx=ctx)
    processes = [ctx.Process(target=_replica_process, args=(arbiter, r, 20)) for r in (0, 1)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(120)
        assert p.exitcode == 0
    stats = arbiter.stats()
    assert stats["inflight_bytes"] == 0 and stats["completed_bytes"] == 2 * 20 * (WINDOW // 2)
    assert [arbiter.replica_stats(r)["swap_out_bytes"] for r in (0, 1)] == [20 * WINDOW // 2] * 2
