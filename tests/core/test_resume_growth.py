"""A sequence that just resumed (swap-in or recompute) is not preempted again at once: it
resumes only when the free blocks also hold the next steps' growth (no ping-pong)."""
from hifc.core.outputs import SamplerOutput
from hifc.core.sequence import SequenceStatus
from tests.core.helpers import FakeTier, make_scheduler, make_seq


def run_with_swaps(sched, seqs, steps, token=5):
    """Run ``steps`` steps; every swap ordered in a step completes (OK) before the next."""
    for _ in range(steps):
        out = sched.schedule()
        sched.update(out, SamplerOutput([token] * len(out.sampling)), seqs)
        for order in out.swap_out:
            sched.swap_out_done(order.request_id, True)
        for order in out.swap_in:
            sched.swap_in_done(order.request_id, True)


def crowded_pair(mode, tier=None):
    """A 5-block pool (16-token blocks): a (40-token prompt, 8 tokens to go) holds 3 blocks,
    b (31-token prompt) 2, and b needs a third block in its second decode step."""
    sched, kv = make_scheduler(num_blocks=5, block_size=16, mode=mode, tier=tier)
    seqs = {"a": make_seq("a", 40, max_tokens=8, arrival=0),
            "b": make_seq("b", 31, max_tokens=40, arrival=1)}
    for seq in seqs.values():
        sched.add(seq)
    return sched, kv, seqs


def test_a_swapped_sequence_is_not_resumed_into_its_own_preemption():
    """Resumed with only its holes free, b would need its third block in its next step and,
    the newest, preempt itself again: a swap-out and a swap-in every other step while a runs."""
    tier = FakeTier(16)
    sched, kv, seqs = crowded_pair("swap", tier)
    run_with_swaps(sched, seqs, 12)
    assert seqs["b"].num_preemptions == 1 and sched.num_preemptions == 1
    assert seqs["a"].status is SequenceStatus.FINISHED_LENGTH
    run_with_swaps(sched, seqs, 60)
    assert seqs["b"].status is SequenceStatus.FINISHED_LENGTH
    assert sched.num_preemptions == 1 and sched.swap_in_blocks == sched.swap_out_blocks == 2
    assert kv.num_free_blocks == 5 and len(tier.free_ids) == 16
