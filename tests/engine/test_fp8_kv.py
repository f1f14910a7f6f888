"""The FP8 KV cache (kv_cache_dtype fp8) through the engine: twice the tokens per GiB, half the
bytes per swapped token, greedy outputs unchanged by swapping and prefix caching, scales from
the checkpoint (or 1.0) that name the cache in the model salt."""
import random

import pytest
import torch
from safetensors.torch import save_file

from hifc import LLM, LLMEngine, SamplingParams
from hifc.config import EngineConfig, add_engine_args, engine_config_from_args
from hifc.engine.model_salt import model_salt
from hifc.runtime.kv_cache import scale_digest
from tests.fixtures import make_tiny_hf_model

MODEL = "random:tiny-llama"
BLOCK = 16
PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
NUM_PROMPTS = 5


def prompts():
    """Prompts that fill most of one block, so every sequence needs a second block soon."""
    rng = random.Random(7)
    return [[rng.randrange(3, 512) for _ in range(BLOCK - 4 - i)] for i in range(NUM_PROMPTS)]


def generate(llm, prompt_list=None):
    return [o.token_ids for o in llm.generate(prompt_list or prompts(), PARAMS, use_tqdm=False)]


def tier_options(kind, path):
    if kind == "dram":
        return dict(kv_offload="dram", swap_space=0.01)
    return dict(kv_offload="flash", flash_path=str(path), flash_size_gib=0.01)


def test_the_option_its_alias_and_its_flag():
    assert EngineConfig(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    assert EngineConfig.from_options(kv_cache_dtype="fp8_e4m3").options()["kv_cache_dtype"] \
        == "fp8_e4m3"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, fp8_e4m3"):
        EngineConfig(kv_cache_dtype="int8")
    import argparse
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--kv-cache-dtype", "fp8"])
    assert engine_config_from_args(args).kv_cache_dtype == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8_e5m2"])


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3"])
def test_the_same_budget_holds_twice_the_tokens(kv_cache_dtype):
    common = dict(device="cpu", dtype="bfloat16", block_size=BLOCK, kv_cache_gib=0.01)
    bf16 = LLMEngine.from_options(MODEL, **common)
    fp8 = LLMEngine.from_options(MODEL, kv_cache_dtype=kv_cache_dtype, **common)
    assert bf16.runner.kv_cache.dtype == torch.bfloat16
    assert fp8.runner.kv_cache.dtype == fp8.kv_dtype == torch.float8_e4m3fn
    assert 2 * fp8.limits.block_bytes == bf16.limits.block_bytes
    assert fp8.limits.num_gpu_blocks == 2 * bf16.limits.num_gpu_blocks
    used = fp8.runner.kv_cache.numel() * fp8.runner.kv_cache.element_size()
    assert used == fp8.limits.num_gpu_blocks * fp8.limits.block_bytes <= 0.01 * 2**30


@pytest.fixture(scope="module")
def fp8_reference():
    """fp8 greedy outputs without memory pressure (and the bf16 ones)."""
    common = dict(device="cpu", dtype="bfloat16", block_size=BLOCK, num_gpu_blocks=64)
    fp8 = generate(LLM(MODEL, kv_cache_dtype="fp8", **common))
    bf16 = generate(LLM(MODEL, **common))
    return fp8, bf16


@pytest.mark.parametrize("kind", ["dram", "flash"])
def test_swapping_keeps_fp8_greedy_outputs_and_moves_half_the_bytes(fp8_reference, kind,
                                                                     tmp_path):
    """5 sequences x 2 blocks do not fit in 7 blocks: preemptions swap to the tier."""
    per_token = {}
    for kv_cache_dtype, expected in zip(["fp8", "auto"], fp8_reference):
        llm = LLM(MODEL, device="cpu", dtype="bfloat16", block_size=BLOCK, num_gpu_blocks=7,
                  kv_cache_dtype=kv_cache_dtype,
                  **tier_options(kind, tmp_path / f"{kv_cache_dtype}.hifc"))
        assert generate(llm) == expected
        stats = llm.stats()
        assert stats["preemptions"] > 0 and stats["recomputed_sequences"] == 0
        assert stats["swap_in_blocks"] == stats["swap_out_blocks"] > 0
        assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
        assert stats["tier_blocks_used"] == 0
        per_token[kv_cache_dtype] = stats["tier_bytes_written"] / (stats["swap_out_blocks"] * BLOCK)
        assert stats["tier_bytes_read"] == stats["tier_bytes_written"]
        llm.close()
    arch = LLMEngine.from_options(MODEL, device="cpu", num_gpu_blocks=4).arch
    fp8_bytes = 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim  # 1 byte
    assert per_token == {"fp8": fp8_bytes, "auto": 2 * fp8_bytes}


def test_prefix_caching_and_chunked_prefill_keep_fp8_outputs(fp8_reference):
    """Prompts sharing a 3-block prefix; prefix caching finds it in float8 blocks."""
    rng = random.Random(3)
    shared = [rng.randrange(3, 512) for _ in range(3 * BLOCK)]
    prompt_list = [shared + [rng.randrange(3, 512) for _ in range(5 + i)] for i in range(4)]
    common = dict(device="cpu", block_size=BLOCK, num_gpu_blocks=64, kv_cache_dtype="fp8")
    expected = generate(LLM(MODEL, enable_prefix_caching=False, enable_chunked_prefill=False,
                            **common), prompt_list)
    llm = LLM(MODEL, max_num_batched_tokens=24, max_num_seqs=4, **common)
    assert generate(llm, prompt_list) == expected
    assert generate(llm, prompt_list) == expected  # again, every prompt cached but its tail
    assert llm.stats()["prefix_cache_hits"] >= 3 * 3 * BLOCK + 4 * 3 * BLOCK


def test_padded_decode_with_fp8_matches_unpadded():
    from tests.runtime.helpers import SkipPaddingReference
    common = dict(device="cpu", block_size=BLOCK, num_gpu_blocks=64, kv_cache_dtype="fp8")
    expected = generate(LLM(MODEL, **common))
    llm = LLM(MODEL, **common)
    runner = llm.engine.runner
    runner.backend = SkipPaddingReference()
    runner.use_padded_decode(llm.engine.limits.max_model_len, [1, 2, 4, 8], capture=False)
    assert generate(llm) == expected
    assert runner.num_padded_decode_steps > 0


def test_the_kv_dtype_and_its_scales_enter_the_salt():
    def engine(**options):
        return LLMEngine.from_options(MODEL, device="cpu", num_gpu_blocks=8, block_size=BLOCK,
                                      **options)

    auto, fp8 = engine(), engine(kv_cache_dtype="fp8")
    assert fp8.model_salt != auto.model_salt
    assert engine(kv_cache_dtype="fp8_e4m3").model_salt == fp8.model_salt
    ones = torch.ones(fp8.arch.num_hidden_layers, 2, fp8.arch.num_key_value_heads)
    assert fp8.kv_geometry.scale_digest == scale_digest(ones) != ""
    assert auto.kv_geometry.scale_digest == ""
    halves = fp8.kv_geometry.__class__(**{**fp8.kv_geometry.__dict__,
                                          "scale_digest": scale_digest(ones / 2)})
    assert model_salt(MODEL, 0, fp8.arch, halves) != fp8.model_salt


# ---- scales from a checkpoint ---------------------------------------------------------------
def add_scales(model_dir, tensors):
    save_file(tensors, model_dir / "kv_scales.safetensors", metadata={"format": "pt"})
    return str(model_dir)


def test_checkpoint_scales_per_layer_and_per_head(tmp_path):
    model_dir = make_tiny_hf_model(tmp_path / "m", "llama")  # 2 layers, 2 KV heads
    path = add_scales(model_dir, {
        "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
        "model.layers.0.self_attn.v_scale": torch.tensor([0.25]),
        "model.layers.1.self_attn.k_proj.k_scale": torch.tensor([0.125, 2.0]),  # per head
        "model.layers.1.self_attn.v_proj.v_scale": torch.tensor(1.5, dtype=torch.bfloat16)})
    llm = LLM(path, device="cpu", block_size=BLOCK, num_gpu_blocks=32, kv_cache_dtype="fp8")
    scales = torch.stack(llm.engine.runner.kv_scales)  # [L, 2, Hkv]
    assert torch.equal(scales, torch.tensor([[[0.5, 0.5], [0.25, 0.25]],
                                             [[0.125, 2.0], [1.5, 1.5]]]))
    assert llm.engine.kv_geometry.scale_digest == scale_digest(scales)
    assert all(len(t) == 24 for t in generate(llm, [[5, 6, 7, 8]] * 2))
    # without fp8 the scales are read and ignored
    auto = LLM(path, device="cpu", block_size=BLOCK, num_gpu_blocks=32)
    assert auto.engine.runner.kv_scales is None


def test_legacy_kv_scale_serves_k_and_v(tmp_path):
    model_dir = make_tiny_hf_model(tmp_path / "m", "llama")
    path = add_scales(model_dir, {f"model.layers.{i}.self_attn.kv_scale": torch.tensor(0.75)
                                  for i in range(2)})
    engine = LLMEngine.from_options(path, device="cpu", num_gpu_blocks=8, kv_cache_dtype="fp8")
    assert torch.equal(torch.stack(engine.runner.kv_scales), torch.full((2, 2, 2), 0.75))


@pytest.mark.parametrize("tensors,message", [
    ({"model.layers.0.self_attn.k_scale": torch.ones(3)}, "has shape \\(3,\\); hifc reads one "
     "scale per layer or one per KV head \\(2\\)"),
    ({"model.layers.0.self_attn.k_scale": torch.tensor(1.0),
      "model.layers.0.self_attn.v_scale": torch.tensor(1.0)}, "none \\(k_scale\\) for layer 1"),
    ({f"model.layers.{i}.self_attn.{kind}": torch.tensor(-1.0 if i else 1.0)
      for i in range(2) for kind in ("k_scale", "v_scale")}, "not finite and positive"),
    ({"model.layers.5.self_attn.kv_scale": torch.tensor(1.0)}, "the model has 2 layers"),
    ({"model.layers.0.self_attn.kv_scale": torch.tensor(1.0),
      "model.layers.0.self_attn.k_scale": torch.tensor(1.0)}, "has both"),
    ({"model.layers.0.self_attn.k_scale": torch.tensor(1.0),
      "model.layers.0.self_attn.k_proj.k_scale": torch.tensor(1.0)}, "two k_scale tensors"),
])
def test_unsupported_checkpoint_scales_are_refused(tmp_path, tensors, message):
    model_dir = make_tiny_hf_model(tmp_path / "m", "llama")
    with pytest.raises(ValueError, match=message):
        LLMEngine.from_options(add_scales(model_dir, tensors), device="cpu", num_gpu_blocks=8,
                               kv_cache_dtype="fp8")
