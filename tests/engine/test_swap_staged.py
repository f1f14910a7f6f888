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


def freed_victims(engine) -> list[str]:
    """The sequences swapping out that hold no GPU block."""
    sched = engine.scheduler
    return [rid for rid in sched.swapping_out
            if not any(block >= 0 for block in sched.kv.block_table(rid))]


def step_until_staged(engine) -> dict:
    """Step until a sequence swapping out (its write held at the gate) holds no GPU block."""
    for _ in range(60):
        engine.step()
        if freed_victims(engine):
            return engine.stats()
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
        assert not io.gate.is_set() and stats["swap_jobs_pending"] > 0
        assert stats["swap_out_blocks"] == 0  # no write has ended
        assert stats["swap_out_blocks_freed_staged"] > 0
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
        engine.abort_request(freed_victims(engine))
    finally:
        io.gate.set()
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_free(engine)
    engine.close()


def test_a_step_that_waits_for_swap_io_says_what_waits(tmp_path, caplog):
    """With writes held, the victim cannot come back before its write ends: once the others
    are done the engine waits, and at debug level it logs the queues it waited with."""
    import logging

    engine, io = engine_with_held_writes(tmp_path)
    try:
        step_until_staged(engine)
    except BaseException:
        io.gate.set()
        raise
    swapper = engine.swaps.swapper
    collect = swapper.collect

    def collect_opening(block, **kwargs):
        if block:  # the engine waits for swap I/O: let the held writes through
            io.gate.set()
        return collect(block=block, **kwargs)

    swapper.collect = collect_opening
    with caplog.at_level(logging.DEBUG, logger="hifc.engine.swaps"):
        assert run_to_end(engine) == reference(BLOCK_SIZE)
    waits = [r.getMessage() for r in caplog.records if "waiting on swap I/O" in r.getMessage()]
    assert waits and waits[0].split("with ")[1].startswith("0 running, 0 waiting"), waits
    assert " 0 swapping out" not in waits[0], waits  # the victims' writes are what it waits on
    engine.close()
