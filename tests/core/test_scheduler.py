"""Scheduler and KV manager behaviour, without a model."""
import pytest

from hifc.core.kv_manager import HOLE, AllocStatus, KVCacheManager
from hifc.core.outputs import SamplerOutput
from hifc.core.preemption import PreemptionMode, PreemptionPolicy
from hifc.core.sequence import SequenceStatus
from tests.core.helpers import FakeTier, make_scheduler, make_seq, run_step


def test_check_never_changes_state():
    kv = KVCacheManager(4, 16)
    assert kv.can_allocate("a", 33) is AllocStatus.OK
    assert kv.num_free_blocks == 4
    assert kv.can_allocate("a", 16 * 5) is AllocStatus.NEVER
    kv.allocate("a", 33)
    assert kv.block_table("a") == [0, 1, 2]
    assert kv.can_allocate("b", 17) is AllocStatus.LATER
    kv.free("a")
    assert kv.num_free_blocks == 4


def test_holds_means_allocating_takes_nothing():
    """``holds``, the scheduler's shortcut for decodes, is true exactly where ``allocate``
    would add no block: the table has room and no hole."""
    kv = KVCacheManager(4, 16)
    assert not kv.holds("a", 1)  # no table yet
    kv.allocate("a", 17)
    assert kv.holds("a", 32) and not kv.holds("a", 33)
    table = kv.block_table("a")
    kv.release("a", [0])  # swapped out: a hole to fill first
    assert not kv.holds("a", 17) and kv.num_new_blocks("a", 17) == 1
    holed = kv.block_table("a")
    kv.fill_holes("a", {})
    assert kv.holds("a", 32) and kv.allocate("a", 32) == []
    # a table object only grows: what the runner read of it stays true (TableRows)
    assert table == [0, 1] and holed == [HOLE, 1] and kv.block_table("a") is not holed
    filled = kv.block_table("a")
    kv.allocate("a", 40)  # growing keeps the object
    assert kv.block_table("a") is filled and len(filled) == 3 and filled[1] == 1


def test_prefill_then_decode_batches_all():
    sched, kv = make_scheduler()
    seqs = {f"r{i}": make_seq(f"r{i}", 10, arrival=i) for i in range(3)}
    for s in seqs.values():
        sched.add(s)
    out = run_step(sched, seqs)
    assert [len(w.token_ids) for w in out.scheduled] == [10, 10, 10]
    out = run_step(sched, seqs)
    assert [(len(w.token_ids), w.start_pos) for w in out.scheduled] == [(1, 10)] * 3


def test_preempts_newest_by_recompute_and_outputs_continue():
    sched, kv = make_scheduler(num_blocks=4, block_size=16)
    seqs = {f"r{i}": make_seq(f"r{i}", 16, arrival=i) for i in range(2)}
    for s in seqs.values():
        sched.add(s)
    run_step(sched, seqs)  # each holds one full block + needs a second on the next step
    run_step(sched, seqs)  # both grow to 2 blocks: pool full (4 blocks)
    for _ in range(15):
        run_step(sched, seqs)
    out = sched.schedule()  # both need a third block: the newest (r1) is preempted
    assert out.preempted_request_ids == ["r1"]
    assert seqs["r1"].status is SequenceStatus.WAITING and seqs["r1"].num_computed_tokens == 0
    assert [w.request_id for w in out.scheduled] == ["r0"]
    assert sched.num_preemptions == 1


def test_finish_frees_blocks_and_length_limit():
    sched, kv = make_scheduler()
    seqs = {"a": make_seq("a", 5, max_tokens=3)}
    sched.add(seqs["a"])
    for _ in range(3):
        run_step(sched, seqs)
    assert seqs["a"].status is SequenceStatus.FINISHED_LENGTH
    assert kv.num_free_blocks == kv.num_total_blocks
    assert sched.schedule().finished_request_ids == ["a"]


def test_eos_stops_unless_ignored():
    sched, kv = make_scheduler()
    seqs = {"a": make_seq("a", 5)}
    sched.add(seqs["a"])
    run_step(sched, seqs, token=0)
    assert seqs["a"].status is SequenceStatus.FINISHED_STOPPED


def test_prompt_larger_than_pool_is_refused():
    sched, kv = make_scheduler(num_blocks=2, block_size=16)
    with pytest.raises(ValueError, match="more KV blocks than the pool"):
        sched.add(make_seq("a", 40))


def test_core_does_not_import_torch():
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "import hifc.core.scheduler, hifc.core.kv_manager, hifc.core.sequence, "
            "hifc.core.block_pool, hifc.core.block_hash\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def fill_two_sequences(sched, seqs):
    """Two 16-token prompts in a 4-block pool, decoded until both need a third block."""
    for s in seqs.values():
        sched.add(s)
    for _ in range(17):
        run_step(sched, seqs)


def swap_pair(tier_blocks=16):
    """A swap-mode scheduler over a 4-block pool, with two sequences filled by
    ``fill_two_sequences``: returns ``(sched, kv, tier, seqs)``."""
    tier = FakeTier(tier_blocks)
    sched, kv = make_scheduler(num_blocks=4, mode="swap", tier=tier)
    seqs = {f"r{i}": make_seq(f"r{i}", 16, arrival=i) for i in range(2)}
    fill_two_sequences(sched, seqs)
    return sched, kv, tier, seqs


def test_swap_out_holds_gpu_blocks_until_the_write_completes():
    sched, kv, tier, seqs = swap_pair()
    out = sched.schedule()
    assert [o.request_id for o in out.swap_out] == ["r1"]
    assert out.swap_out[0].pairs == [(b, t) for b, t in zip(kv.block_table("r1"), [0, 1])]
    assert out.scheduled == []  # r0 waits for r1's blocks instead of preempting itself
    assert kv.num_free_blocks == 0 and len(tier.free_ids) == 14
    sched.swap_out_done("r1", ok=True)
    assert seqs["r1"].status is SequenceStatus.SWAPPED and kv.num_free_blocks == 2
    out = sched.schedule()
    assert [w.request_id for w in out.scheduled] == ["r0"] and out.swap_in == []
    sched.update(out, SamplerOutput([5]), seqs)


def test_swap_in_restores_and_failed_swap_falls_back_to_recompute():
    sched, kv, tier, seqs = swap_pair()
    sched.schedule()  # r1 swaps out
    victim = seqs["r1"]
    computed = victim.num_computed_tokens
    sched.swap_out_done("r1", ok=True)
    sched.finish(seqs["r0"], SequenceStatus.FINISHED_ABORTED)  # room for r1 again
    out = sched.schedule()
    assert [o.request_id for o in out.swap_in] == ["r1"] and out.scheduled == []
    assert [t for t, _ in out.swap_in[0].pairs] == [0, 1]  # the tier blocks it was written to
    assert victim.status is SequenceStatus.SWAPPING_IN
    sched.swap_in_done("r1", ok=False)  # e.g. a checksum mismatch
    assert victim.status is SequenceStatus.WAITING and victim.num_computed_tokens == 0
    assert computed == 32 and sched.num_swap_failures == 1 and len(tier.free_ids) == 16
    out = sched.schedule()  # re-prefilled over prompt + generated tokens
    assert [(w.request_id, len(w.token_ids)) for w in out.scheduled] == [("r1", 33)]


def test_swapped_sequence_resumes_decoding_where_it_stopped():
    sched, kv, tier, seqs = swap_pair()
    sched.schedule()
    sched.swap_out_done("r1", ok=True)
    sched.finish(seqs["r0"], SequenceStatus.FINISHED_ABORTED)
    sched.schedule()
    sched.swap_in_done("r1", ok=True)
    out = sched.schedule()
    assert [(w.request_id, w.start_pos, len(w.token_ids)) for w in out.scheduled] == [
        ("r1", 32, 1)]
    assert sched.swap_out_blocks == sched.swap_in_blocks == 2 and len(tier.free_ids) == 16


def test_tier_full_preempts_by_recompute():
    sched, kv, tier, seqs = swap_pair(tier_blocks=1)
    out = sched.schedule()
    assert out.swap_out == [] and out.preempted_request_ids == ["r1"]
    assert sched.num_recomputed_sequences == 1


def test_abort_while_swapping_out_frees_everything_on_completion():
    sched, kv, tier, seqs = swap_pair()
    sched.schedule()
    sched.finish(seqs["r1"], SequenceStatus.FINISHED_ABORTED)
    assert kv.num_free_blocks == 0  # I/O still in flight: nothing released yet
    sched.swap_out_done("r1", ok=True)
    assert kv.num_free_blocks == 2 and len(tier.free_ids) == 16
    assert sched.tier_blocks_used == 0


def test_auto_chooses_the_cheaper_preemption():
    policy = PreemptionPolicy("auto", block_bytes=1 << 20)
    assert policy.choose(4, 64) is PreemptionMode.SWAP  # nothing measured yet
    policy.tier_bandwidth.add(1 << 30, 1.0)  # 1 GiB/s
    policy.prefill_speed.add(10_000, 1.0)  # 10k tokens/s
    assert policy.choose(num_blocks=4, num_tokens=256) is PreemptionMode.SWAP  # 8 ms vs 26 ms
    assert policy.choose(num_blocks=64, num_tokens=64) is PreemptionMode.RECOMPUTE
