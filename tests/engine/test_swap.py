"""Preemption by swapping to the DRAM and flash tiers: outputs never change, blocks never leak."""
import random

import pytest

from hifc import LLM, LLMEngine, SamplingParams

MODEL = "random:tiny-llama"
NUM_PROMPTS = 5


def prompts_for(block_size):
    """Prompts that fill most of one block, so every sequence needs a second block soon."""
    rng = random.Random(block_size)
    return [[rng.randrange(3, 512) for _ in range(block_size - 4 - i)] for i in range(NUM_PROMPTS)]


PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
_reference_cache = {}


def reference(block_size):
    """Greedy outputs without memory pressure."""
    if block_size not in _reference_cache:
        llm = LLM(MODEL, device="cpu", block_size=block_size, num_gpu_blocks=64)
        _reference_cache[block_size] = [o.token_ids for o in
                                        llm.generate(prompts_for(block_size), PARAMS,
                                                     use_tqdm=False)]
    return _reference_cache[block_size]


def tight_llm(block_size, tmp_path, **options):
    # 5 sequences x 2 blocks do not fit in 7 blocks: forces preemption.
    return LLM(MODEL, device="cpu", block_size=block_size, num_gpu_blocks=7, **options)


def tier_options(kind, tmp_path, policy="append", **extra):
    if kind == "dram":
        return dict(kv_offload="dram", swap_space=0.01, flash_policy=policy, **extra)
    return dict(kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.01,
                flash_policy=policy, **extra)


def assert_all_released(llm):
    stats = llm.stats()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert stats["tier_blocks_used"] == 0 and stats["swap_jobs_pending"] == 0
    if llm.engine.tier is not None:
        assert llm.engine.tier.num_free_blocks == llm.engine.tier.num_blocks


@pytest.mark.parametrize("block_size", [16, 64, 256])
@pytest.mark.parametrize("kind,policy", [("dram", "append"), ("flash", "append"),
                                         ("flash", "left-append")])
def test_swapping_keeps_greedy_outputs(block_size, kind, policy, tmp_path):
    llm = tight_llm(block_size, tmp_path, **tier_options(kind, tmp_path, policy))
    outputs = [o.token_ids for o in llm.generate(prompts_for(block_size), PARAMS, use_tqdm=False)]
    assert outputs == reference(block_size)
    stats = llm.stats()
    assert stats["preemptions"] > 0 and stats["swap_out_blocks"] > 0
    assert stats["swap_in_blocks"] == stats["swap_out_blocks"]
    assert stats["tier_bytes_written"] > 0 and stats["tier_bytes_read"] > 0
    assert stats["recomputed_sequences"] == 0
    assert_all_released(llm)
    llm.engine.close()


@pytest.mark.parametrize("op,effect", [("write", "eio"), ("write", "enospc"), ("read", "eio"),
                                       ("read", "short"), ("read", "bitflip")])
def test_faults_degrade_to_recompute_with_same_outputs(op, effect, tmp_path):
    llm = tight_llm(64, tmp_path, **tier_options("flash", tmp_path, tier_fault_injection=True))
    llm.engine.tier.faults.arm(op, effect, times=3)
    outputs = [o.token_ids for o in llm.generate(prompts_for(64), PARAMS, use_tqdm=False)]
    assert outputs == reference(64)
    stats = llm.stats()
    assert stats["swap_failures"] > 0 and stats["recomputed_sequences"] > 0
    assert_all_released(llm)
    llm.engine.close()


def test_full_tier_falls_back_to_recompute(tmp_path):
    llm = tight_llm(64, tmp_path, kv_offload="dram", swap_space=5e-5)  # room for one block
    outputs = [o.token_ids for o in llm.generate(prompts_for(64), PARAMS, use_tqdm=False)]
    assert outputs == reference(64)
    assert llm.stats()["recomputed_sequences"] > 0
    assert_all_released(llm)


def test_auto_preemption_keeps_outputs(tmp_path):
    llm = tight_llm(16, tmp_path, **tier_options("flash", tmp_path), preemption="auto")
    outputs = [o.token_ids for o in llm.generate(prompts_for(16), PARAMS, use_tqdm=False)]
    assert outputs == reference(16)
    assert llm.stats()["preemptions"] > 0
    assert_all_released(llm)


def test_abort_in_every_swap_state_frees_gpu_and_tier_blocks(tmp_path):
    engine = LLMEngine.from_options(MODEL, device="cpu", block_size=16, num_gpu_blocks=7,
                                    **tier_options("flash", tmp_path))
    for i, p in enumerate(prompts_for(16) * 3):
        engine.add_request(f"r{i}", p, PARAMS)
    seen = set()
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        sched = engine.scheduler
        states = {s.request_id: s.status.value for s in
                  [*sched.running, *sched.swapped, *sched.swapping_out.values(),
                   *sched.swapping_in.values()]}
        for rid, state in states.items():
            if state not in seen and rid in engine._requests:
                seen.add(state)
                engine.abort_request(rid)
    assert seen == {"running", "swapping_out", "swapped", "swapping_in"}, seen
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert stats["tier_blocks_used"] == 0 and stats["swap_jobs_pending"] == 0
    assert engine.tier.num_free_blocks == engine.tier.num_blocks
    engine.close()


def test_offload_options_are_validated(tmp_path):
    with pytest.raises(ValueError, match="flash_path"):
        LLM(MODEL, device="cpu", kv_offload="flash", flash_size_gib=1)
    with pytest.raises(ValueError, match="needs a swap tier"):
        LLM(MODEL, device="cpu", preemption="swap")
    with pytest.raises(ValueError, match="kv_offload must be one of"):
        LLM(MODEL, device="cpu", kv_offload="ssd")
    with pytest.raises(ValueError, match="flash_policy"):
        LLM(MODEL, device="cpu", kv_offload="dram", swap_space=1, flash_policy="random")
    with pytest.raises(ValueError, match="flash_backend"):
        LLM(MODEL, device="cpu", kv_offload="flash", flash_path=str(tmp_path / "kv"),
            flash_size_gib=0.01, flash_backend="spdk")


def test_flash_backend_flag_reaches_the_tier(tmp_path):
    import argparse

    from hifc.config import add_engine_args, engine_config_from_args
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--model", MODEL, "--device", "cpu", "--kv-offload", "flash",
                              "--flash-path", str(tmp_path / "kv"), "--flash-size-gib", "0.01",
                              "--flash-backend", "posix"])
    config = engine_config_from_args(args)
    assert config.tier.flash_backend == "posix"
    llm = LLM(**{**config.options(), "num_gpu_blocks": 16})
    assert llm.engine.tier.stats()["backend"] == "posix"
    llm.engine.close()
    assert engine_config_from_args(parser.parse_args([])).tier.flash_backend == "auto"
