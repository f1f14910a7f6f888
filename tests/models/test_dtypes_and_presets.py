"""Half-precision loading, random presets, and merged-weight layout."""
import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.loader import load_model
from hifc.models import PRESETS, preset_arch, size_estimate
from tests.fixtures import greedy_decode_paged, make_tiny_hf_model

PROMPTS = [[1, 5, 9, 13, 2, 7], list(range(10, 40))]


@pytest.fixture(scope="module")
def fp32_reference(tmp_path_factory):
    from transformers import AutoModelForCausalLM
    path = make_tiny_hf_model(tmp_path_factory.mktemp("llama3"), "llama3")
    return path, AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_tracks_fp32(fp32_reference, dtype):
    path, hf = fp32_reference
    loaded = load_model(str(path), dtype, torch.device("cpu"))
    assert all(p.dtype == dtype for p in loaded.model.parameters())
    tokens, prefill = greedy_decode_paged(loaded.model, PROMPTS, num_tokens=4)
    with torch.no_grad():
        for prompt, logits, toks in zip(PROMPTS, prefill, tokens):
            ref = hf(torch.tensor([prompt])).logits[0]
            assert logits.dtype == dtype and torch.isfinite(logits).all()
            assert (logits - ref).abs().max() < 0.1 * ref.abs().max()
            assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8
            assert len(toks) == 4


def test_checkpoint_saved_in_bf16_loads_in_fp32(tmp_path):
    path = make_tiny_hf_model(tmp_path, "qwen2", dtype="bfloat16")
    loaded = load_model(str(path), torch.float32, "cpu")
    tokens, _ = greedy_decode_paged(loaded.model, PROMPTS, num_tokens=3)
    assert all(len(t) == 3 for t in tokens)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3",
                                    "tiny-gemma2", "tiny-phi3"])
def test_tiny_presets_are_seeded_and_run(preset):
    a = load_model(f"random:{preset}", torch.float32, "cpu", seed=1)
    b = load_model(f"random:{preset}", torch.float32, "cpu", seed=1)
    c = load_model(f"random:{preset}", torch.float32, "cpu", seed=2)
    assert a.tokenizer is None and a.name == f"random:{preset}" and a.arch == PRESETS[preset]
    pa, pb, pc = (dict(m.model.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[n], pb[n]) for n in pa)
    assert not torch.equal(pa["model.embed_tokens.weight"], pc["model.embed_tokens.weight"])
    identity = 0.0 if a.arch.architecture == "Gemma2ForCausalLM" else 1.0  # Gemma: 1 + weight
    assert torch.equal(pa["model.norm.weight"], torch.full_like(pa["model.norm.weight"], identity))
    std = pa["model.layers.0.mlp.gate_up_proj.weight"].std().item()
    assert 0.015 < std < 0.025
    tokens, _ = greedy_decode_paged(a.model, PROMPTS, num_tokens=3)
    assert all(0 <= t < a.arch.vocab_size for seq in tokens for t in seq)


@pytest.mark.parametrize("preset, num_params", [
    ("ds-r1-llama-8b", 8_030_261_248),   # Llama-3.1-8B
    ("ds-r1-qwen-14b", 14_770_033_664),  # Qwen2.5-14B
    ("ds-r1-qwen-32b", 32_763_876_352),  # Qwen2.5-32B
    ("mistral-7b", 7_248_023_552),       # Mistral-7B-v0.3
    ("qwen3-8b", 8_190_735_360),         # Qwen3-8B
    ("gemma2-9b", 9_241_705_984),        # Gemma-2-9B
    ("phi3-mini", 3_821_079_552),        # Phi-3-mini-4k-instruct
])
def test_real_size_presets_have_the_published_parameter_counts(preset, num_params):
    assert size_estimate(preset_arch(preset), torch.bfloat16).parameter_bytes == 2 * num_params


def test_sliding_window_leaves_the_context_length_alone():
    # Attention honours the window, so sequences may outgrow it (up to the model's context).
    llm = LLM("random:tiny-mistral", device="cpu", block_size=16, num_gpu_blocks=128)
    window = preset_arch("tiny-mistral").sliding_window
    assert llm.engine.limits.max_model_len == 1024 > 2 * window
    prompt = list(range(3, 3 + 2 * window))
    out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].token_ids) == 4


def test_llama_8b_preset_has_llama31_rope_scaling():
    arch = preset_arch("ds-r1-llama-8b")
    assert arch.rope_scaling["rope_type"] == "llama3" and arch.rope_theta == 500000.0
    assert (arch.num_key_value_heads, arch.head_dim, arch.vocab_size) == (8, 128, 128256)
    assert preset_arch("ds-r1-qwen-14b").attention_bias


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_8b_preset_builds_on_gpu_in_seconds():
    import time
    start = time.perf_counter()
    loaded = load_model("random:ds-r1-llama-8b", torch.bfloat16, "cuda")
    torch.cuda.synchronize()
    assert time.perf_counter() - start < 30
    assert loaded.model.model.embed_tokens.weight.is_cuda
    del loaded
    torch.cuda.empty_cache()
