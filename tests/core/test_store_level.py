"""The flash prefix store as the scheduler's second level (torch-free, a fake store): the cost
rule, admission through LOADING, write-behind, swap-outs that hold stored blocks."""
import pytest

from hifc.core.preemption import PreemptionPolicy, RateMeter
from hifc.core.prefix_policy import PrefixReadPolicy
from hifc.core.scheduler import Scheduler, SchedulerLimits
from hifc.core.sequence import SequenceStatus
from hifc.core.store_level import StoreLevel
from hifc.core.kv_manager import KVCacheManager
from tests.core.helpers import SALT, FakeTier, make_seq, run_step

BS = 16


class FakeStore:
    """The prefix store under one salt: a set of hashes, holds counted."""

    def __init__(self):
        self.hashes: set[bytes] = set()
        self.held: list[int] = []
        self.ids: dict[bytes, int] = {}

    def num_stored(self, hashes):
        n = 0
        for h in hashes:
            if h not in self.hashes:
                break
            n += 1
        return n

    def hold(self, hashes):
        blocks = [self.ids.setdefault(h, len(self.ids)) for h in hashes[:self.num_stored(hashes)]]
        self.held += blocks
        return blocks

    def release(self, blocks):
        for b in blocks:
            self.held.remove(b)


def rule(mode="auto", bandwidth=None, speed=None, block_bytes=1000):
    prefill, read = RateMeter(), RateMeter()
    if speed:
        prefill.add(speed, 1.0)
    if bandwidth:
        read.add(bandwidth, 1.0)
    return PrefixReadPolicy(mode, block_bytes, BS, prefill, read)


def test_the_cost_rule_compares_reading_with_recomputing():
    assert rule().blocks_to_read(5) == 5  # nothing measured yet: read (the read measures)
    assert rule(bandwidth=1000, speed=8).blocks_to_read(5) == 5  # a block: 1 s read, 2 s prefill
    assert rule(bandwidth=1000, speed=32).blocks_to_read(5) == 0  # 1 s read, 0.5 s prefill
    assert rule(bandwidth=1000).blocks_to_read(5) == 5  # prefill not measured yet
    assert rule("always", bandwidth=1, speed=10 ** 9).blocks_to_read(3) == 3
    assert rule().blocks_to_read(0) == 0
    with pytest.raises(ValueError, match="prefix_store_read must be one of auto, always"):
        rule("never")


def make(num_blocks=8, store=None, write_mode="evicted", lookahead=2, tier=None, mode="recompute",
         max_num_seqs=8, read=None):
    kv = KVCacheManager(num_blocks, BS, watermark=0.0, salt=SALT)
    store = store or FakeStore()
    level = StoreLevel(store, read or rule("always"), write_mode, kv.pool, lookahead)
    sched = Scheduler(SchedulerLimits(max_num_seqs, 128, 128, True), kv,
                      PreemptionPolicy(mode, 4096), tier, level)
    return sched, kv, store, level


def test_admission_reads_stored_blocks_then_prefills_the_rest():
    sched, kv, store, level = make()
    a = make_seq("a", 50, max_tokens=2)
    store.hashes.update(kv.block_hashes(a)[:2])
    sched.add(a)
    out = sched.schedule()
    assert a.status is SequenceStatus.LOADING and not out.scheduled
    (read,) = out.prefix_reads
    assert [h for h, _ in read.pairs] == kv.block_hashes(a)[:2]
    assert [g for _, g in read.pairs] == kv.block_table("a")
    b = make_seq("b", 40, max_tokens=2)  # shares a's first two blocks: waits for the read
    sched.add(b)
    assert not sched.schedule().prefix_reads and b.status is SequenceStatus.WAITING
    sched.prefix_read_done("a", blocks_ok=1)  # the second record failed verification
    assert a.status is SequenceStatus.RUNNING and a.num_computed_tokens == BS
    assert a.num_cached_tokens == BS
    out = run_step(sched, {"a": a, "b": b})
    work = {w.request_id: w for w in out.scheduled}
    assert work["a"].start_pos == BS  # recomputes from its first bad block
    # b finds a's first block, and the second one that a recomputes in this very step
    assert work["b"].start_pos == 2 * BS
    stats = level.stats()
    assert stats["prefix_store_hits"] == 2 * BS and stats["prefix_store_read_tokens"] == BS
    assert stats["prefix_store_read_failures"] == 1 and stats["prefix_store_reads"] == 1


def test_the_rule_recomputes_past_a_slow_store():
    sched, kv, store, level = make(read=rule(bandwidth=1, speed=10 ** 6))
    a = make_seq("a", 50)
    store.hashes.update(kv.block_hashes(a))
    sched.add(a)
    out = sched.schedule()
    assert not out.prefix_reads and out.scheduled[0].start_pos == 0
    assert level.stats()["prefix_store_recomputed"] == 3 * BS


def test_an_aborted_loading_sequence_frees_its_blocks_when_the_read_ends():
    sched, kv, store, _ = make()
    a = make_seq("a", 50)
    store.hashes.update(kv.block_hashes(a))
    sched.add(a)
    sched.schedule()
    sched.finish(a, SequenceStatus.FINISHED_ABORTED)
    assert kv.block_table("a") and sched.is_tracking("a")
    sched.prefix_read_done("a", blocks_ok=3)
    assert not sched.is_tracking("a") and kv.num_free_blocks == 8


def test_evicted_mode_writes_the_blocks_next_in_line_and_holds_them_meanwhile():
    sched, kv, store, level = make(num_blocks=6, lookahead=3)
    a = make_seq("a", 64, max_tokens=1)
    sched.add(a)
    out = run_step(sched, {"a": a})  # a prefills 4 full blocks and stops
    assert a.status.is_finished and kv.num_cached_free_blocks == 4
    assert out.prefix_writes == []  # scheduled before a ended
    writes = sched.schedule().prefix_writes
    # 2 uncached free blocks, 3 may be needed: the oldest cached one is written first
    assert len(writes) == 1 and kv.num_free_blocks == 5
    assert writes[0][1] == kv.block_hashes(a)[3]  # a's last block is freed first
    assert sched.schedule().prefix_writes == []  # never twice
    sched.prefix_write_done(writes, written=True)
    store.hashes.add(writes[0][1])
    # stored, it goes first in line for eviction: the window of one block is covered
    assert kv.num_free_blocks == 6 and kv.pool.oldest_cached_free(1) == [writes[0][0]]
    assert sched.schedule().prefix_writes == []
    kv.pool.allocate(1)  # one uncached free block less: the window grows to two
    assert [h for _, h in sched.schedule().prefix_writes] == [kv.block_hashes(a)[2]]
    assert level.stats()["prefix_store_evicted_unstored"] == 0


def test_all_mode_writes_every_block_once_computed():
    sched, kv, store, level = make(write_mode="all")
    a = make_seq("a", 40, max_tokens=30)
    seqs = {"a": a}
    sched.add(a)
    run_step(sched, seqs)  # 2 full blocks computed
    out = run_step(sched, seqs)  # the decode of position 40
    assert [h for _, h in out.prefix_writes] == kv.block_hashes(a)[:2]
    for _ in range(7):
        out = run_step(sched, seqs)  # decodes of positions 41..47 fill block 2
        assert out.prefix_writes == []
    writes = sched.schedule().prefix_writes
    assert [h for _, h in writes] == [kv.block_hashes(a)[2]]


def preempt_with_stored_blocks():
    """a and b decode in 7 blocks until b, the newest, is swapped out; the store holds b's two
    full blocks. (tier, sched, kv, store, a, b, the step that preempted b)"""
    tier = FakeTier(16)
    sched, kv, store, _ = make(num_blocks=7, tier=tier, mode="swap", max_num_seqs=2)
    a = make_seq("a", 48, max_tokens=100, arrival=0)
    b = make_seq("b", 40, max_tokens=100, arrival=1, tokens=range(100, 140))
    seqs = {"a": a, "b": b}
    sched.add(a)
    sched.add(b)
    run_step(sched, seqs)
    store.hashes.update(kv.block_hashes(b)[:2])  # the store has b's two full blocks
    for _ in range(20):
        out = run_step(sched, seqs)
        if out.preempted_request_ids:
            break
    return tier, sched, kv, store, a, b, out


def test_a_swap_out_holds_the_stored_blocks_and_reads_them_back_if_evicted():
    tier, sched, kv, store, a, b, out = preempt_with_stored_blocks()
    assert out.preempted_request_ids == ["b"]  # b, the newest, needs a 4th block
    (order,) = out.swap_out
    assert len(order.pairs) == 1 and len(store.held) == 2  # the stored two are held
    assert order.pairs[0][0] == kv.block_table("b")[2]
    sched.swap_out_done("b", ok=True)
    assert kv.block_table("b") == [-1, -1, -1]
    sched.finish(a, SequenceStatus.FINISHED_ABORTED)
    kv.pool.release(kv.pool.allocate(kv.num_free_blocks))  # evict every cached block
    out = sched.schedule()
    (swap_in,) = out.swap_in
    (read,) = out.prefix_reads
    assert len(swap_in.pairs) == 1 and [h for h, _ in read.pairs] == kv.block_hashes(b)[:2]
    assert sorted([g for _, g in read.pairs] + [swap_in.pairs[0][1]]) == sorted(
        kv.block_table("b"))
    sched.prefix_read_done("b", 2)
    assert b.status is SequenceStatus.SWAPPING_IN  # the swap-in is still running
    sched.swap_in_done("b", ok=True)
    assert b.status is SequenceStatus.RUNNING and store.held == []
    assert tier.can_reserve(16)


def test_a_failed_prefix_read_of_a_swap_in_recomputes():
    tier, sched, kv, store, a, b, _ = preempt_with_stored_blocks()
    sched.swap_out_done("b", ok=True)
    sched.finish(a, SequenceStatus.FINISHED_ABORTED)
    kv.pool.release(kv.pool.allocate(kv.num_free_blocks))
    sched.schedule()
    sched.swap_in_done("b", ok=True)
    sched.prefix_read_done("b", 1)  # a record failed verification
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0
    assert store.held == [] and kv.num_free_blocks == 7 and tier.can_reserve(16)
