"""Scheduling step N+1 before step N's tokens are applied (asynchronous scheduling), without a
model: pending tokens, sequences that stop or end while a step is in flight, preemption."""
from hifc.core.outputs import SamplerOutput
from hifc.core.scheduler import PENDING_TOKEN
from hifc.core.sequence import SequenceStatus
from tests.core.helpers import make_scheduler, make_seq, run_step
from tests.core.test_prefix_cache import Fuzz, run_fuzz


def apply(sched, out, seqs, token=5):
    """Feed ``token`` to every sequence that samples in ``out`` (a step scheduled earlier)."""
    return sched.update(out, SamplerOutput([token] * len(out.sampling)), seqs)


def run_ahead(sched, seqs, tokens=lambda rid, n: 5, max_steps=100) -> int:
    """Drive the scheduler one step ahead until every sequence ends: schedule step N+1, then
    apply step N's tokens (``tokens(request_id, index among its outputs)``). Returns the steps
    scheduled."""
    in_flight = None
    for num_steps in range(max_steps):
        out = sched.schedule()
        if in_flight is not None:
            sampled = [tokens(w.request_id, len(seqs[w.request_id].output_token_ids))
                       for w in in_flight.sampling]
            sched.update(in_flight, SamplerOutput(sampled), seqs)
        if out.is_empty and in_flight is None:
            return num_steps
        in_flight = None if out.is_empty else out
    raise AssertionError("the sequences did not end")


def test_a_decode_scheduled_before_its_input_token_is_known_reads_it_as_pending():
    sched, kv = make_scheduler()
    seqs = {"a": make_seq("a", 10)}
    sched.add(seqs["a"])
    prefill = sched.schedule()
    decode = sched.schedule()  # the prefill's token is not applied yet
    assert [(w.token_ids, w.start_pos, w.samples) for w in decode.scheduled] == [
        ([PENDING_TOKEN], 10, True)]
    assert seqs["a"].num_pending_tokens == 2
    apply(sched, prefill, seqs, token=7)
    apply(sched, decode, seqs, token=8)
    assert seqs["a"].output_token_ids == [7, 8] and seqs["a"].num_pending_tokens == 0
    assert run_step(sched, seqs).scheduled[0].token_ids == [8]  # known again: no placeholder


def test_a_sequence_whose_pending_tokens_reach_max_tokens_is_not_scheduled_again():
    sched, kv = make_scheduler()
    seqs = {"a": make_seq("a", 5, max_tokens=2), "b": make_seq("b", 5, max_tokens=9, arrival=1)}
    for s in seqs.values():
        sched.add(s)
    first, second = sched.schedule(), sched.schedule()
    third = sched.schedule()  # a's two tokens are on their way: it needs no third step
    assert [w.request_id for w in third.scheduled] == ["b"]
    for out in (first, second, third):
        apply(sched, out, seqs)
    assert seqs["a"].status is SequenceStatus.FINISHED_LENGTH
    assert seqs["a"].output_token_ids == [5, 5]


def test_a_token_sampled_after_the_sequence_stopped_is_dropped():
    sched, kv = make_scheduler()
    seqs = {"a": make_seq("a", 5), "b": make_seq("b", 5, max_tokens=6, arrival=1)}
    for s in seqs.values():
        sched.add(s)
    run_ahead(sched, seqs, tokens=lambda rid, n: 0 if (rid, n) == ("a", 2) else 5)  # 0: EOS
    assert seqs["a"].output_token_ids == [5, 5, 0]  # the token of the step after is dropped
    assert seqs["a"].status is SequenceStatus.FINISHED_STOPPED
    assert seqs["b"].output_token_ids == [5] * 6
    assert kv.num_free_blocks == kv.num_total_blocks
    assert all(s.num_pending_tokens == 0 for s in seqs.values())


def test_scheduling_ahead_gives_the_same_tokens_and_steps_as_in_turn():
    def tokens(rid, n):
        return (3 * n + len(rid)) % 11 + 1  # never EOS (0)

    def make():
        sched, kv = make_scheduler(num_blocks=12, block_size=16, budget=24)
        seqs = {f"r{i}": make_seq(f"r{i}", 10 + 9 * i, max_tokens=4 + 5 * i, arrival=i)
                for i in range(4)}
        for s in seqs.values():
            sched.add(s)
        return sched, kv, seqs

    sched, kv, seqs = make()
    while any(not s.status.is_finished for s in seqs.values()):
        out = sched.schedule()
        sched.update(out, SamplerOutput(
            [tokens(w.request_id, len(seqs[w.request_id].output_token_ids))
             for w in out.sampling]), seqs)
    expected = {rid: s.output_token_ids for rid, s in seqs.items()}
    sched, kv, seqs = make()
    run_ahead(sched, seqs, tokens)
    assert {rid: s.output_token_ids for rid, s in seqs.items()} == expected
    assert kv.num_free_blocks == kv.num_total_blocks


def test_a_sequence_preempted_while_its_token_is_pending_resumes_with_that_token():
    sched, kv = make_scheduler(num_blocks=4, block_size=16)
    seqs = {f"r{i}": make_seq(f"r{i}", 16, arrival=i) for i in range(2)}
    for s in seqs.values():
        sched.add(s)
    for _ in range(16):  # both hold two blocks, their next token fills them
        run_step(sched, seqs)
    in_flight = sched.schedule()
    out = sched.schedule()  # both would decode into a third block: r1 is preempted
    assert out.preempted_request_ids == ["r1"]
    assert [w.request_id for w in out.scheduled] == ["r0"]
    r1 = seqs["r1"]
    assert r1.status is SequenceStatus.WAITING and r1.num_pending_tokens == 1
    before = len(r1.output_token_ids)
    apply(sched, in_flight, seqs, token=9)  # the preempted sequence keeps its token
    assert r1.output_token_ids[before:] == [9] and r1.num_pending_tokens == 0
    apply(sched, out, seqs)
    sched.finish(seqs["r0"], SequenceStatus.FINISHED_ABORTED)
    resumed = sched.schedule()
    assert [(w.request_id, w.start_pos, w.token_ids) for w in resumed.scheduled] == [
        ("r1", 0, r1.token_ids())]  # recomputed, with the token that arrived


class FuzzAhead(Fuzz):
    """The prefix-cache fuzz (random shared prefixes, tight pool, random swap outcomes, aborts)
    driven one step ahead, with EOS now and then: a token is applied after the next step is
    scheduled. Also checks that no cached block holds a token still pending."""

    def __init__(self, seed, mode):
        super().__init__(seed, mode)
        self.launched = None

    def step(self):
        self.complete_some_swaps()
        out = self.sched.schedule()
        self.in_flight += [("out", o.request_id) for o in out.swap_out]
        self.in_flight += [("in", o.request_id) for o in out.swap_in]
        if self.launched is not None:
            tokens = [self.rng.randrange(0, 50) for _ in self.launched.sampling]  # 0: EOS
            self.sched.update(self.launched, SamplerOutput(tokens), self.seqs)
        self.launched = None if out.is_empty else out
        if self.seqs and self.rng.random() < 0.1:
            victim = self.rng.choice(list(self.seqs.values()))
            self.sched.finish(victim, SequenceStatus.FINISHED_ABORTED)
        self.check()

    def check(self):
        super().check()
        kv = self.kv
        for seq in self.sched.running:
            hashes = kv.block_hashes(seq)  # of the blocks whose tokens are all known
            for position, block in enumerate(kv.block_table(seq.request_id)):
                cached = kv.pool.block_hash(block)
                assert cached is None or (position < len(hashes)
                                          and cached == hashes[position])

    def drain(self):
        while self.launched is not None or self.in_flight or self.sched.running \
                or self.sched.waiting or self.sched.swapped:
            self.step()


def test_no_block_leaks_or_stale_hashes_when_scheduling_ahead():
    for seed in range(12):
        fuzz = FuzzAhead(seed, mode="swap" if seed % 3 else "recompute")
        run_fuzz(fuzz)
        assert all(s.num_pending_tokens == 0 for s in fuzz.seqs.values())
        assert any(s.status is SequenceStatus.FINISHED_STOPPED for s in fuzz.seqs.values())
