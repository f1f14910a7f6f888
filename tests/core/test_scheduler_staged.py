"""The scheduler frees a swap-out's GPU blocks as the tier reports them staged (before the
write ends); the sequence stays SWAPPING_OUT until the write's outcome, and a failure then
makes it recompute."""
from hifc.core.outputs import SamplerOutput
from hifc.core.sequence import SequenceStatus
from tests.core.helpers import FakeTier, make_seq
from tests.core.test_resume_growth import crowded_pair, run_with_swaps


def preempt_b(sched, seqs):
    """Step (no swap completing) until b's swap-out is ordered; returns the order."""
    for _ in range(12):
        out = sched.schedule()
        sched.update(out, SamplerOutput([5] * len(out.sampling)), seqs)
        if out.swap_out:
            return out.swap_out[0]
    raise AssertionError("b was never swapped out")


def test_staged_blocks_are_freed_before_the_write_ends_and_a_failure_recomputes():
    tier = FakeTier(16)
    sched, kv, seqs = crowded_pair("swap", tier)
    order = preempt_b(sched, seqs)
    assert order.request_id == "b" and len(order.pairs) == 2
    free = kv.num_free_blocks
    sched.swap_out_staged("b", [1])
    assert kv.num_free_blocks == free + 1 and seqs["b"].status is SequenceStatus.SWAPPING_OUT
    sched.swap_out_staged("b", [0, 1])  # a pair is freed once
    assert kv.num_free_blocks == free + 2 and all(b < 0 for b in kv.block_table("b"))
    sched.swap_out_done("b", False)  # the write failed after staging: recompute
    assert seqs["b"].status is SequenceStatus.WAITING and sched.num_swap_failures == 1
    assert len(tier.free_ids) == 16
    run_with_swaps(sched, seqs, 80)
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in seqs.values())
    assert len(seqs["b"].output_token_ids) == 40
    assert kv.num_free_blocks == 5 and sched.swap_in_blocks == sched.swap_out_blocks == 0


def test_a_swap_out_staged_in_part_then_written_swaps_back_in():
    tier = FakeTier(16)
    sched, kv, seqs = crowded_pair("swap", tier)
    preempt_b(sched, seqs)
    sched.swap_out_staged("b", [0])
    sched.swap_out_done("b", True)  # the rest is freed when the write ends
    assert seqs["b"].status is SequenceStatus.SWAPPED and all(b < 0 for b in
                                                               kv.block_table("b"))
    run_with_swaps(sched, seqs, 80)
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in seqs.values())
    assert sched.swap_in_blocks == sched.swap_out_blocks == 2 and sched.num_swap_failures == 0
    assert kv.num_free_blocks == 5 and len(tier.free_ids) == 16


def test_no_new_request_takes_the_blocks_a_swap_out_freed():
    """Freed when staged, b's blocks go to the running sequences' growth; a new request waits
    until b is back, as it waits while b is swapped."""
    tier = FakeTier(16)
    sched, kv, seqs = crowded_pair("swap", tier)
    preempt_b(sched, seqs)
    sched.swap_out_staged("b", [0, 1])
    seqs["c"] = make_seq("c", 8, max_tokens=4, arrival=2)
    sched.add(seqs["c"])
    out = sched.schedule()
    assert [w.request_id for w in out.scheduled] == ["a"]
    assert seqs["c"].status is SequenceStatus.WAITING
    sched.update(out, SamplerOutput([5] * len(out.sampling)), seqs)
    sched.swap_out_done("b", True)
    run_with_swaps(sched, seqs, 80)
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in seqs.values())
    assert sched.num_preemptions == 1 and kv.num_free_blocks == 5 and len(tier.free_ids) == 16


def test_a_new_request_runs_when_nothing_else_can_until_a_write_ends():
    """Once a is done, b (its blocks freed when staged) waits for its write to end before it
    can come back; the step would run nothing, so a new request is admitted meanwhile."""
    tier = FakeTier(16)
    sched, kv, seqs = crowded_pair("swap", tier)
    preempt_b(sched, seqs)
    sched.swap_out_staged("b", [0, 1])
    sched.finish(seqs["a"], SequenceStatus.FINISHED_ABORTED)
    seqs["c"] = make_seq("c", 8, max_tokens=4, arrival=2)
    sched.add(seqs["c"])
    out = sched.schedule()
    assert [w.request_id for w in out.scheduled] == ["c"]
    assert seqs["b"].status is SequenceStatus.SWAPPING_OUT
    sched.update(out, SamplerOutput([5] * len(out.sampling)), seqs)
    sched.swap_out_done("b", True)
    run_with_swaps(sched, seqs, 80)
    assert seqs["b"].status is SequenceStatus.FINISHED_LENGTH
    assert seqs["c"].status is SequenceStatus.FINISHED_LENGTH
    assert sched.swap_in_blocks == sched.swap_out_blocks == 2
    assert kv.num_free_blocks == 5 and len(tier.free_ids) == 16
