"""The GPU prefix cache in the scheduler: hits skip prefill, blocks are shared by reference,
preemption never writes or frees a shared block as if owned, and nothing leaks."""
import random

from hifc.core.kv_manager import HOLE, AllocStatus, KVCacheManager
from hifc.core.outputs import SamplerOutput
from hifc.core.sequence import SequenceStatus
from tests.core.helpers import (SALT, FakeTier, block_references, make_scheduler, make_seq,
                                run_step)

PREFIX = list(range(100, 132))  # two full blocks of 16


def run_to_end(sched, seqs, limit=500):
    for _ in range(limit):
        if not (sched.running or sched.waiting):
            return
        run_step(sched, seqs)
    raise AssertionError("sequences did not finish")


def test_same_prompt_twice_skips_the_cached_prefix():
    sched, kv = make_scheduler(prefix_caching=True)
    a = make_seq("a", 0, max_tokens=2, tokens=PREFIX + [7] * 8)
    sched.add(a)
    run_to_end(sched, {"a": a})
    assert kv.num_free_blocks == kv.num_total_blocks and kv.num_cached_free_blocks == 2
    b = make_seq("b", 0, max_tokens=2, tokens=PREFIX + [7] * 8, arrival=1)
    sched.add(b)
    out = run_step(sched, {"b": b})
    assert [(w.start_pos, len(w.token_ids)) for w in out.scheduled] == [(32, 8)]
    assert b.num_cached_tokens == 32 and a.num_cached_tokens == 0
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (80, 32)
    run_to_end(sched, {"b": b})
    assert a.output_token_ids == b.output_token_ids
    assert kv.num_free_blocks == kv.num_total_blocks


def test_a_prompt_of_whole_blocks_still_computes_its_last_token():
    sched, kv = make_scheduler(prefix_caching=True)
    seqs = {"a": make_seq("a", 0, max_tokens=1, tokens=PREFIX)}
    sched.add(seqs["a"])
    run_to_end(sched, seqs)
    seqs["b"] = make_seq("b", 0, max_tokens=1, tokens=PREFIX, arrival=1)
    sched.add(seqs["b"])
    out = run_step(sched, seqs)
    assert [(w.start_pos, len(w.token_ids), w.samples) for w in out.scheduled] == [(16, 16, True)]


def test_without_a_salt_nothing_is_cached_or_counted():
    sched, kv = make_scheduler(prefix_caching=False)
    for i in range(2):
        seqs = {f"r{i}": make_seq(f"r{i}", 0, max_tokens=2, tokens=PREFIX, arrival=i)}
        sched.add(seqs[f"r{i}"])
        out = run_step(sched, seqs)
        assert out.scheduled[0].start_pos == 0
        run_to_end(sched, seqs)
    assert kv.num_cached_free_blocks == 0 and sched.prefix_cache_queries == 0
    assert seqs["r1"].block_hashes == []


def test_running_sequences_share_prefix_blocks_by_reference():
    sched, kv = make_scheduler(prefix_caching=True)
    seqs = {"a": make_seq("a", 0, max_tokens=4, tokens=PREFIX + [1] * 8),
            "b": make_seq("b", 0, max_tokens=30, tokens=PREFIX + [2] * 8, arrival=1)}
    sched.add(seqs["a"])
    run_step(sched, seqs)  # a's prefix blocks are computed and cached
    sched.add(seqs["b"])
    run_step(sched, seqs)
    a_table, b_table = kv.block_table("a"), kv.block_table("b")
    assert b_table[:2] == a_table[:2] and b_table[2] != a_table[2]
    assert [kv.pool.ref_count(blk) for blk in a_table[:3]] == [2, 2, 1]
    run_step(sched, seqs)
    run_step(sched, seqs)  # a ends: the shared blocks stay with b
    assert seqs["a"].status is SequenceStatus.FINISHED_LENGTH
    assert [kv.pool.ref_count(blk) for blk in b_table[:2]] == [1, 1]
    assert block_references(kv, ["b"]) == {blk: 1 for blk in kv.block_table("b")}
    run_to_end(sched, seqs)
    assert kv.num_free_blocks == kv.num_total_blocks


def test_check_counts_evictable_and_hit_blocks_and_changes_nothing():
    kv = KVCacheManager(4, 16, watermark=0.0, salt=SALT)
    seq = make_seq("a", 0, tokens=PREFIX + [3])
    kv.allocate("a", 33)
    kv.cache_blocks(seq, 33)
    kv.free("a")  # 2 cached free blocks + 2 free ones
    again = make_seq("b", 0, tokens=PREFIX + [3])
    prefix = kv.cached_prefix(again)
    assert len(prefix) == 2 and kv.num_free_blocks == 4 and kv.num_cached_free_blocks == 2
    # the hit blocks come out of the free ones too: 2 hit + 2 new = all 4
    assert kv.can_allocate("b", 64, prefix=prefix) is AllocStatus.OK
    assert kv.can_allocate("b", 65, prefix=prefix) is AllocStatus.NEVER
    assert kv.can_allocate("c", 64) is AllocStatus.OK  # by evicting the cached blocks
    assert kv.num_free_blocks == 4 and kv.num_cached_free_blocks == 2
    new = kv.allocate("b", 64, prefix)
    assert sorted(new) == [2, 3] and kv.block_table("b") == prefix + new
    assert kv.can_allocate("c", 16) is AllocStatus.LATER


def test_recompute_victim_finds_its_own_blocks_again():
    sched, kv = make_scheduler(num_blocks=4, prefix_caching=True)
    seqs = {"r0": make_seq("r0", 16, max_tokens=20),
            "r1": make_seq("r1", 0, max_tokens=30, tokens=range(200, 216), arrival=1)}
    for s in seqs.values():
        sched.add(s)
    for _ in range(17):
        run_step(sched, seqs)
    out = run_step(sched, seqs)  # both need a third block: r1 is dropped for recompute
    assert out.preempted_request_ids == ["r1"] and sched.num_recomputed_sequences == 1
    # r0 took one of r1's freed blocks: the last one freed first; r1's first block stays cached
    while seqs["r1"].status is SequenceStatus.WAITING:
        out = run_step(sched, seqs)
    assert [(w.request_id, w.start_pos, len(w.token_ids)) for w in out.scheduled] == [
        ("r1", 16, 17)]
    assert seqs["r1"].num_cached_tokens == 0  # as first admitted; the hit counts in stats
    assert sched.prefix_cache_hits == 16
    run_to_end(sched, seqs)
    assert kv.num_free_blocks == kv.num_total_blocks


def shared_swap_setup():
    """a and b share a 32-token prefix in a 5-block pool; b (newer) gets swapped out when both
    need a fourth block."""
    tier = FakeTier(8)
    sched, kv = make_scheduler(num_blocks=5, mode="swap", tier=tier, prefix_caching=True)
    seqs = {"a": make_seq("a", 0, max_tokens=30, tokens=PREFIX + [1] * 8),
            "b": make_seq("b", 0, max_tokens=30, tokens=PREFIX + [2] * 8, arrival=1)}
    sched.add(seqs["a"])
    run_step(sched, seqs)
    sched.add(seqs["b"])
    for _ in range(20):
        out = run_step(sched, seqs)
        if out.swap_out:
            return sched, kv, tier, seqs, out
    raise AssertionError("no swap-out")


def test_swap_out_writes_only_the_blocks_the_victim_owns():
    sched, kv, tier, seqs, out = shared_swap_setup()
    a_table = kv.block_table("a")
    [order] = out.swap_out
    assert order.request_id == "b" and len(order.pairs) == 1  # its own third block only
    owned_block = order.pairs[0][0]
    assert owned_block not in a_table
    assert kv.block_table("b") == [HOLE, HOLE, owned_block]  # shared ones dropped at once
    assert [kv.pool.ref_count(blk) for blk in a_table[:2]] == [1, 1]  # a's alone now
    assert len(tier.free_ids) == 7
    sched.swap_out_done("b", ok=True)
    assert kv.block_table("b") == [HOLE] * 3 and kv.pool.ref_count(owned_block) == 0
    assert sched.swap_out_blocks == 1


def test_swap_in_finds_the_shared_blocks_by_hash_and_reads_only_its_own():
    sched, kv, tier, seqs, _ = shared_swap_setup()
    sched.swap_out_done("b", ok=True)
    shared = kv.block_table("a")[:2]
    sched.finish(seqs["a"], SequenceStatus.FINISHED_ABORTED)  # shared blocks: cached, free
    assert kv.num_cached_free_blocks >= 2
    out = sched.schedule()
    [order] = out.swap_in
    assert len(order.pairs) == 1 and order.pairs[0][0] == 0  # the tier block it was written to
    assert kv.block_table("b") == shared + [order.pairs[0][1]]
    sched.swap_in_done("b", ok=True)
    computed = seqs["b"].num_computed_tokens
    out = run_step(sched, seqs)
    assert [(w.request_id, w.start_pos) for w in out.scheduled] == [("b", computed)]
    run_to_end(sched, seqs)
    assert kv.num_free_blocks == kv.num_total_blocks and len(tier.free_ids) == 8
    assert sched.swap_in_blocks == sched.swap_out_blocks == 1


def test_a_shared_block_evicted_while_swapped_turns_the_swap_in_into_a_recompute():
    sched, kv, tier, seqs, _ = shared_swap_setup()
    sched.swap_out_done("b", ok=True)
    sched.finish(seqs["a"], SequenceStatus.FINISHED_ABORTED)
    kv.allocate("other", 5 * 16)  # another user of the pool evicts every cached block
    kv.free("other")
    out = run_step(sched, seqs)
    assert out.swap_in == [] and len(tier.free_ids) == 8  # its tier copy is dropped
    assert sched.num_recomputed_sequences == 1
    assert [(w.request_id, w.start_pos) for w in out.scheduled] == [("b", 0)]  # recomputed
    run_to_end(sched, seqs)
    assert kv.num_free_blocks == kv.num_total_blocks


class Fuzz:
    """Random requests over shared prefixes in a tight pool, with random swap outcomes and
    aborts at random points; checks the block accounting after every step."""

    def __init__(self, seed, mode):
        self.rng = random.Random(seed)
        self.tier = FakeTier(40)
        self.sched, self.kv = make_scheduler(num_blocks=12, mode=mode, tier=self.tier,
                                             budget=24, prefix_caching=True, max_len=160)
        self.seqs = {}
        self.in_flight = []  # (op, request id)

    def add(self, i):
        prefix = PREFIX[:self.rng.choice([0, 16, 32])]
        tail = [self.rng.randrange(1, 50) for _ in range(self.rng.randint(1, 40))]
        seq = make_seq(f"r{i}", 0, max_tokens=self.rng.randint(1, 30), tokens=prefix + tail,
                       arrival=i)
        self.seqs[seq.request_id] = seq
        self.sched.add(seq)

    def complete_some_swaps(self):
        keep = []
        for op, rid in self.in_flight:
            if self.rng.random() < 0.5:
                keep.append((op, rid))
                continue
            ok = self.rng.random() < 0.8
            (self.sched.swap_out_done if op == "out" else self.sched.swap_in_done)(rid, ok)
        self.in_flight = keep

    def step(self):
        self.complete_some_swaps()
        out = self.sched.schedule()
        self.in_flight += [("out", o.request_id) for o in out.swap_out]
        self.in_flight += [("in", o.request_id) for o in out.swap_in]
        tokens = [self.rng.randrange(1, 50) for _ in out.sampling]
        self.sched.update(out, SamplerOutput(tokens), self.seqs)
        if self.seqs and self.rng.random() < 0.1:
            victim = self.rng.choice(list(self.seqs.values()))
            self.sched.finish(victim, SequenceStatus.FINISHED_ABORTED)
        self.check()

    def check(self):
        kv = self.kv
        refs = block_references(kv, self.seqs)
        for block in range(kv.num_total_blocks):
            assert kv.pool.ref_count(block) == refs.get(block, 0), block
        assert kv.num_free_blocks == kv.num_total_blocks - len(refs)
        for seq in self.sched.running:
            assert HOLE not in kv.block_table(seq.request_id)

    def drain(self):
        while self.in_flight or self.sched.running or self.sched.waiting or self.sched.swapped:
            self.step()


def run_fuzz(fuzz: Fuzz) -> None:
    """30 requests added among random steps, then every one run to its end: no GPU or tier
    block leaked, nothing tracked, with preemptions and prefix-cache hits along the way."""
    for i in range(30):
        fuzz.add(i)
        for _ in range(fuzz.rng.randint(0, 3)):
            fuzz.step()
    fuzz.drain()
    sched, kv = fuzz.sched, fuzz.kv
    assert sched.num_preemptions > 0 and sched.prefix_cache_hits > 0
    assert kv.num_free_blocks == kv.num_total_blocks
    assert len(fuzz.tier.free_ids) == fuzz.tier.num_blocks and sched.tier_blocks_used == 0
    assert not any(sched.is_tracking(rid) for rid in fuzz.seqs)


def test_no_block_leaks_under_sharing_preemption_and_aborts():
    for seed in range(12):
        run_fuzz(Fuzz(seed, mode="swap" if seed % 3 else "recompute"))


def test_a_prompt_admitted_in_the_same_step_shares_the_blocks_being_computed():
    sched, kv = make_scheduler(prefix_caching=True)
    seqs = {r: make_seq(r, 0, max_tokens=2, tokens=PREFIX + [i] * 5, arrival=i)
            for i, r in enumerate(("a", "b"))}
    for seq in seqs.values():
        sched.add(seq)
    out = run_step(sched, seqs)
    assert [(w.request_id, w.start_pos, len(w.token_ids)) for w in out.scheduled] == [
        ("a", 0, 37), ("b", 32, 5)]
    assert kv.block_table("a")[:2] == kv.block_table("b")[:2]
