"""Tensor parallelism on the CPU (gloo): TP=2 gives TP=1's greedy outputs, swapping to flash
too (each rank its own file); models or launches that do not split are refused."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.layers.tensor_parallel import TPShard
from hifc.parallel.tp_launch import local_rendezvous, rank_flash_path, shard_scales
from hifc.tiers.flash.cache_file import read_superblock
from tests.fixtures import make_tiny_hf_model

PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37] + [40 + i] * (6 - i) for i in range(5)]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A random transformers Llama (4 query / 2 KV heads, MLP 128, vocab 384: all divide by 2)."""
    return str(make_tiny_hf_model(tmp_path_factory.mktemp("tp") / "llama", "llama"))


@pytest.fixture(scope="module")
def reference(llama_dir):
    """TP=1 greedy outputs with room for every sequence."""
    with LLM(llama_dir, device="cpu", num_gpu_blocks=32, block_size=16) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


LOGPROB_PARAMS = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True,
                                prompt_logprobs=2, logprobs=1)


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
def test_tp2_matches_tp1(llama_dir, reference):
    with LLM(llama_dir, device="cpu", num_gpu_blocks=32, block_size=16) as llm:
        expected = llm.generate([PROMPTS[0]], LOGPROB_PARAMS, use_tqdm=False)[0]
    with LLM(llama_dir, device="cpu", num_gpu_blocks=32, block_size=16,
             tensor_parallel_size=2) as llm:
        outputs = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
        with_logprobs = llm.generate([PROMPTS[0]], LOGPROB_PARAMS, use_tqdm=False)[0]
    assert outputs == reference
    # prompt logprobs: rank 0 computes extra logits, which the worker joins (gathered vocab)
    assert with_logprobs.token_ids == expected.token_ids
    assert len(with_logprobs.prompt_logprobs) == len(PROMPTS[0])
    for got, want in zip(with_logprobs.prompt_logprobs[1:], expected.prompt_logprobs[1:]):
        assert got.keys() == want.keys()
        assert all(abs(got[t].logprob - want[t].logprob) < 1e-4 for t in got)


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
def test_tp2_gathers_bfloat16_logits_as_tp1_computes_them(llama_dir):
    """A bfloat16 model's logits leave the LM head in bfloat16 and are gathered over the ranks
    so: prompt logprobs (teacher-forced, so the same positions) match TP=1's within bfloat16's
    rounding of the sums the two splits order differently."""
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    runs = []
    for tp in (1, 2):
        with LLM(llama_dir, device="cpu", dtype="bfloat16", num_gpu_blocks=32, block_size=16,
                 tensor_parallel_size=tp) as llm:
            runs.append(llm.generate(PROMPTS[:2], params, use_tqdm=False))
    for one, two in zip(*runs):
        for got, want in zip(two.prompt_logprobs[1:], one.prompt_logprobs[1:]):
            assert got.keys() == want.keys()  # the prompt's own token at each position
            assert all(abs(got[t].logprob - want[t].logprob) < 0.1 for t in got)


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
def test_tp2_builds_every_rank_with_the_hf_overrides(llama_dir, reference):
    """Each rank loads the first layer only, as TP=1 does with the same overrides; the two
    differ from the whole model's outputs."""
    cut = {"num_hidden_layers": 1}
    outputs = {}
    for tp in (1, 2):
        with LLM(llama_dir, device="cpu", num_gpu_blocks=32, block_size=16,
                 tensor_parallel_size=tp, hf_overrides=cut) as llm:
            assert llm.engine.arch.num_hidden_layers == 1
            outputs[tp] = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    assert outputs[2] == outputs[1] != reference


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
def test_a_worker_that_died_is_named_and_the_engine_still_closes(llama_dir):
    from hifc.parallel.tp_driver import WorkerLost

    llm = LLM(llama_dir, device="cpu", num_gpu_blocks=32, block_size=16, tensor_parallel_size=2)
    worker = llm.engine.tp.processes[0]
    worker.kill()
    worker.join(10)
    with pytest.raises(WorkerLost, match=f"worker {worker.name} \\(exit code -9\\) exited"):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    with pytest.raises(WorkerLost):  # the engine stays unusable
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    llm.close()  # no error: nothing is sent to the ranks that are gone


@pytest.mark.slow  # starts a worker process per architecture
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma2", "phi3"])
def test_tp2_matches_tp1_for_other_architectures(tmp_path, arch):
    """Biases (Qwen2), q/k norms (Qwen3), soft-capping, a sliding window and the unit-offset
    norms (Gemma 2), checkpoints with fused QKV and gate/up (Phi-3): each split in two."""
    path = str(make_tiny_hf_model(tmp_path / arch, arch))
    outputs = {}
    for tp in (1, 2):
        with LLM(path, device="cpu", num_gpu_blocks=32, block_size=16,
                 tensor_parallel_size=tp) as llm:
            assert (llm.engine.tp is not None) == (tp == 2)
            outputs[tp] = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    assert outputs[2] == outputs[1]


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
@pytest.mark.parametrize("kind", ["flash", "dram"])
def test_tp2_swapping_matches_tp1(llama_dir, reference, tmp_path, kind):
    path = tmp_path / "kv.hifc"
    tier = (dict(kv_offload="flash", flash_path=str(path), flash_size_gib=0.01)
            if kind == "flash" else dict(kv_offload="dram", swap_space=0.01))
    # 5 sequences x 2 blocks do not fit in 7 blocks: forces preemption, swapped out
    with LLM(llama_dir, device="cpu", num_gpu_blocks=7, block_size=16, tensor_parallel_size=2,
             **tier) as llm:
        outputs = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
        stats = llm.stats()
        tier = llm.engine.tier
        assert tier.stats()["ranks"] == 2
        assert tier.num_free_blocks == tier.num_blocks
    assert outputs == reference
    assert stats["preemptions"] > 0 and stats["swap_out_blocks"] > 0
    assert stats["swap_in_blocks"] == stats["swap_out_blocks"]
    assert stats["recomputed_sequences"] == 0 and stats["swap_failures"] == 0
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    # each rank wrote its own shard (half the bytes) into its own file, which says whose it is
    assert stats["tier_bytes_written"] == stats["swap_out_blocks"] * tier.block_bytes
    for rank in (0, 1) if kind == "flash" else ():
        superblock = read_superblock(rank_flash_path(str(path), rank))
        assert (superblock["tp_rank"], superblock["tp_size"]) == (rank, 2)


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
def test_a_failed_rank_part_turns_the_swap_into_a_recompute(llama_dir, reference, tmp_path):
    """Rank 0's reads fail (rank 1's succeed): the swap-ins fail as a whole, those sequences
    are recomputed on both ranks, the outputs do not change and every block is released."""
    with LLM(llama_dir, device="cpu", num_gpu_blocks=7, block_size=16, tensor_parallel_size=2,
             kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.01,
             tier_fault_injection=True) as llm:
        llm.engine.tier.faults.arm("read", "eio", times=3)
        outputs = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
        stats = llm.stats()
        tier = llm.engine.tier
        assert tier.num_free_blocks == tier.num_blocks
    assert outputs == reference
    assert stats["swap_failures"] > 0 and stats["recomputed_sequences"] > 0
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]


def test_heads_that_do_not_divide_are_refused():
    # SmolLM2-135M: 9 query heads, 3 KV heads
    with pytest.raises(ValueError, match="tensor_parallel_size=2 must divide the model's 9 "
                                         "attention heads"):
        LLM("smollm2-135m", device="cpu", tensor_parallel_size=2)


def test_a_launcher_world_of_another_size_is_refused(monkeypatch):
    for name, value in dict(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="29500").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="started 3 processes .* tensor_parallel_size is 2"):
        LLM("random:tiny-llama", device="cpu", tensor_parallel_size=2)


def test_each_rank_has_its_own_flash_file():
    assert [rank_flash_path("/nvme/kv.hifc", r) for r in range(3)] == [
        "/nvme/kv.hifc", "/nvme/kv.hifc.rank1", "/nvme/kv.hifc.rank2"]
    assert rank_flash_path("/nvme/kv-{rank}.hifc", 1) == "/nvme/kv-1.hifc"


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
def test_tp2_under_a_launcher_matches_tp1(llama_dir):
    """torchrun starts both ranks; rank 1 becomes rank 0's worker at the same LLM(...) call."""
    with LLM(llama_dir, device="cpu", num_gpu_blocks=16, block_size=16) as llm:
        expected = [o.token_ids for o in llm.generate([[1, 5, 9, 13]], SamplingParams(
            max_tokens=6, temperature=0.0, ignore_eos=True), use_tqdm=False)]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(local_rendezvous(2).init_method.rsplit(":", 1)[1]),
         str(root / "tests" / "parallel" / "tp_launched_main.py"), llama_dir],
        env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == expected


@pytest.mark.slow  # starts a worker process (~3-5 s on the CPU VM)
def test_tp2_prefix_store_is_found_again_after_a_restart(llama_dir, tmp_path):
    """Every rank writes its shard of each stored block into its own file; a new TP=2 engine
    on the same files reads them back (rank 0's index, every rank's records verified)."""
    prompts = [list(range(5, 45)), list(range(5, 37)) + list(range(100, 110))]  # 2 full blocks
    with LLM(llama_dir, device="cpu", num_gpu_blocks=32, block_size=16) as llm:
        expected = [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
    options = dict(device="cpu", num_gpu_blocks=32, block_size=16, tensor_parallel_size=2,
                   kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"),
                   flash_size_gib=0.01, prefix_store_read="always")
    with LLM(llama_dir, **options) as llm:  # closing writes the cached blocks to the store
        assert [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)] == expected
    with LLM(llama_dir, **options) as llm:
        outputs = [o.token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
        stats = llm.stats()
    assert outputs == expected
    assert stats["prefix_store_hits"] >= 32 and stats["prefix_store_read_failures"] == 0
    assert stats["prefix_store_read_tokens"] == stats["prefix_store_hits"]


def test_each_rank_keeps_the_kv_scales_of_its_heads():
    scales = torch.arange(2 * 2 * 4, dtype=torch.float32).view(2, 2, 4)  # [L, K/V, Hkv]
    assert torch.equal(shard_scales(scales, TPShard(1, 2)), scales[:, :, 2:])
    assert shard_scales(scales, TPShard(0, 1)) is scales and shard_scales(None, TPShard(1, 2)) \
        is None
