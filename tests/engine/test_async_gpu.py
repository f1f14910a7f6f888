"""Asynchronous scheduling on a CUDA GPU (CUDA graphs, pinned copies, device-side pending
tokens, tiers' copies ordered after the steps in flight): the outputs of the engine without it."""
import pytest
import torch

from hifc import LLM, SamplingParams
from tests.engine.test_async_scheduling import assert_same, completions, prompts_with_shared_prefix

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def run(async_scheduling: bool, prompts, params, **options):
    llm = LLM("random:tiny-llama", device="cuda", dtype="float32", block_size=16,
              max_num_seqs=8, async_scheduling=async_scheduling, **options)
    try:
        result = completions(llm.generate(prompts, params, use_tqdm=False))
        stats = llm.stats()
    finally:
        llm.close()
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert (stats["overlapped_steps"] > 0) == async_scheduling
    return result, stats


@pytest.mark.parametrize("tier", [None, "dram", "posix"])
def test_outputs_are_unchanged_on_gpu(tier, tmp_path):
    prompts = prompts_with_shared_prefix(6, seed=11)
    params = [SamplingParams(max_tokens=20 + 2 * i, temperature=0, ignore_eos=True)
              for i in range(3)]
    params += [SamplingParams(max_tokens=18, temperature=0.9, seed=3, n=2, ignore_eos=True,
                              logprobs=3),
               SamplingParams(max_tokens=16, temperature=1.0, seed=4, ignore_eos=True,
                              presence_penalty=0.5, repetition_penalty=1.2, min_p=0.05),
               SamplingParams(max_tokens=22, temperature=0, ignore_eos=True, min_tokens=3)]
    options = dict(num_gpu_blocks=64)
    if tier == "dram":
        options = dict(num_gpu_blocks=12, kv_offload="dram", swap_space=0.01)
    elif tier == "posix":
        options = dict(num_gpu_blocks=12, kv_offload="flash", flash_backend="posix",
                       flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.01)
    sync, _ = run(False, prompts, params, **options)
    overlapped, stats = run(True, prompts, params, **options)
    assert_same(overlapped, sync)
    assert stats["graph_decode_steps"] > 0
    if tier is not None:
        assert stats["swap_in_blocks"] > 0
