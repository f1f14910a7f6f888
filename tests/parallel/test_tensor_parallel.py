"""Tensor parallelism on the CPU (gloo): TP=2 gives TP=1's greedy outputs, swapping to flash
too (each rank its own file); models or launches that do not split are refused."""
import pytest

from hifc import LLM, SamplingParams
from hifc.parallel.tp_launch import rank_flash_path
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


def test_tp2_matches_tp1(llama_dir, reference):
    with LLM(llama_dir, device="cpu", num_gpu_blocks=32, block_size=16,
             tensor_parallel_size=2) as llm:
        outputs = [o.token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    assert outputs == reference


def test_tp2_swapping_to_flash_matches_tp1(llama_dir, reference, tmp_path):
    path = tmp_path / "kv.hifc"
    # 5 sequences x 2 blocks do not fit in 7 blocks: forces preemption, swapped to flash
    with LLM(llama_dir, device="cpu", num_gpu_blocks=7, block_size=16, tensor_parallel_size=2,
             kv_offload="flash", flash_path=str(path), flash_size_gib=0.01) as llm:
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
    for rank in (0, 1):
        superblock = read_superblock(rank_flash_path(str(path), rank))
        assert (superblock["tp_rank"], superblock["tp_size"]) == (rank, 2)


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
