"""A swap-out to flash frees the victim's GPU blocks once the tier has staged them in host
memory, before the write to the file ends; outputs never change, and a write that fails after
staging makes the sequence recompute."""
import pytest

from hifc import LLMEngine
from tests.engine.test_swap import PARAMS, prompts_for, reference, tier_options
from tests.tiers.tier_helpers import gated

BLOCK_SIZE = 16


def engine_with_held_writes(tmp_path, faults=False):
    """The tight engine of test_swap over a flash tier whose I/O waits at a closed gate."""
    engine = LLMEngine.from_options(
        "random:tiny-llama", device="cpu", block_size=BLOCK_SIZE, num_gpu_blocks=7,
        preemption="swap", **tier_options("flash", tmp_path, prefix_store="off",
                                          tier_fault_injection=faults))
    io = gated(engine.tier, chunk_blocks=1, num_buffers=8)
    for i, prompt in enumerate(prompts_for(BLOCK_SIZE)):
        engine.add_request(f"r{i}", prompt, PARAMS)
    return engine, io


def step_until_staged(engine) -> dict:
    """Step until a swap-out has freed GPU blocks (its write held at the gate)."""
    for _ in range(60):
        engine.step()
        stats = engine.stats()
        if stats["swap_out_blocks_freed_staged"]:
            return stats
    raise AssertionError("no swap-out freed its blocks when staged")


def run_to_end(engine) -> list[list[int]]:
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    return [outputs[f"r{i}"] for i in range(len(outputs))]


def assert_all_free(engine):
    stats = engine.stats()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert stats["tier_blocks_used"] == 0 and stats["swap_jobs_pending"] == 0
    assert engine.tier.num_free_blocks == engine.tier.num_blocks


@pytest.mark.parametrize("faults", [False, True])
def test_gpu_blocks_are_free_before_the_write_ends(faults, tmp_path):
    """With faults, every write fails once let through: after staging, so the sequences whose
    blocks were freed recompute."""
    engine, io = engine_with_held_writes(tmp_path, faults)
    if faults:
        engine.tier.faults.arm("write", "eio", times=1000)
    try:
        stats = step_until_staged(engine)
        sched = engine.scheduler
        assert not io.gate.is_set() and stats["swap_jobs_pending"] > 0
        assert stats["swap_out_blocks"] == 0  # no write has ended
        # the victims hold no GPU block while their writes wait
        freed = [rid for rid in sched.swapping_out if not any(
            b >= 0 for b in sched.kv.block_table(rid))]
        assert freed
    finally:
        io.gate.set()
    assert run_to_end(engine) == reference(BLOCK_SIZE)
    stats = engine.stats()
    if faults:
        assert stats["swap_failures"] > 0 and stats["recomputed_sequences"] > 0
        assert stats["swap_out_blocks"] == 0
    else:
        assert stats["swap_failures"] == 0 and stats["recomputed_sequences"] == 0
        assert stats["swap_in_blocks"] == stats["swap_out_blocks"] > 0
    assert_all_free(engine)
    engine.close()


def test_abort_after_staging_frees_everything(tmp_path):
    engine, io = engine_with_held_writes(tmp_path)
    try:
        step_until_staged(engine)
        victims = list(engine.scheduler.swapping_out)
        engine.abort_request(victims)
    finally:
        io.gate.set()
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_free(engine)
    engine.close()
