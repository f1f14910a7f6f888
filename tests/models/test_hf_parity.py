"""Each architecture against transformers on tiny random models (fp32): prefill logits, greedy
tokens through the paged cache and through the engine, and the same model exported to GGUF.

The long prompt (40 tokens) and the generations cross the sliding windows (24 tokens) of
Mistral, Gemma 2 and Phi-3; Gemma 2's soft-caps are low enough to change every score and logit.
"""
import dataclasses

import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.loader import load_model
from tests.fixtures import (TINY_ARCHS, TINY_SLIDING_WINDOW, greedy_decode_paged,
                            make_tiny_hf_model, paged_metadata)
from tests.gguf_export import export_gguf

PROMPTS = [[1, 5, 9, 13, 2, 7], [3, 3, 8], list(range(10, 50)), [42]]
LONG = 2  # index of the prompt longer than the sliding window
NUM_TOKENS = 20
# llama3 and LongRoPE scaling travel in GGUF as rope factor tensors, which hifc refuses.
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3")


@pytest.fixture(scope="module", params=TINY_ARCHS)
def tiny(request, tmp_path_factory):
    """(model dir, our loaded model, transformers' model, transformers' greedy tokens)."""
    from transformers import AutoModelForCausalLM
    path = make_tiny_hf_model(tmp_path_factory.mktemp(request.param), request.param)
    ours = load_model(str(path), torch.float32, torch.device("cpu"))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    greedy = [hf.generate(torch.tensor([p]), max_new_tokens=NUM_TOKENS,
                          do_sample=False)[0, len(p):].tolist() for p in PROMPTS]
    return path, ours, hf, greedy


def _hf_logits(hf, prompt):
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0]  # [P, V]


def test_batched_prefill_logits_match_transformers(tiny):
    _, ours, hf, _ = tiny
    _, prefill_logits = greedy_decode_paged(ours.model, PROMPTS, num_tokens=1)
    for prompt, logits in zip(PROMPTS, prefill_logits):
        ref = _hf_logits(hf, prompt)
        assert logits.dtype == torch.float32 and logits.shape == ref.shape
        torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_paged_greedy_decode_matches_generate(tiny):
    _, ours, _, greedy = tiny
    generated, _ = greedy_decode_paged(ours.model, PROMPTS, num_tokens=NUM_TOKENS, block_size=4)
    assert generated == greedy


def test_engine_greedy_matches_generate(tiny):
    # Through LLM.generate: blocks of 16, so every sequence crosses a block boundary.
    path, _, _, greedy = tiny
    llm = LLM(str(path), device="cpu", dtype="float32", block_size=16, num_gpu_blocks=32,
              max_model_len=128)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [g[:16] for g in greedy]


def _prefill(model, rows, narrowed=False):
    """One batched prefill of PROMPTS into a fresh paged cache: (the model's output, of the
    tokens ``rows`` lists if not None, the last layer attending those alone with ``narrowed``;
    the cache)."""
    from hifc.layers.attention import AttentionContext, TorchAttentionBackend, kept_rows
    arch, block_size = model.arch, 4
    tables, table, counts = [], 1, [len(p) for p in PROMPTS]
    for n in counts:
        tables.append(list(range(table, table + -(-n // block_size))))
        table += len(tables[-1])
    kv = torch.zeros(arch.num_hidden_layers, 2, table, block_size, arch.num_key_value_heads,
                     arch.head_dim)
    meta = paged_metadata(tables, [0] * len(PROMPTS), counts, block_size, "cpu")
    kept = kept_rows(meta, rows) if narrowed else None
    keep = None if rows is None else (
        kept.index if narrowed else torch.tensor(rows, dtype=torch.long))
    ctx = AttentionContext(meta, list(kv.unbind(0)), TorchAttentionBackend(),
                           model.attention_layers, kept=kept)
    ids = torch.tensor([t for p in PROMPTS for t in p])
    positions = torch.tensor([i for n in counts for i in range(n)])
    with torch.no_grad():
        return model(ids, positions, ctx, keep), kv


@pytest.mark.parametrize("narrowed", [False, True], ids=["attended-among-all", "attended-alone"])
@pytest.mark.parametrize("rows", [[5, 8, 48, 49], [49, 0, 20], []])
def test_kept_rows_are_the_rows_of_the_whole_output(tiny, rows, narrowed):
    # The last layer's output projection and MLP (and, narrowed, its attention) run on the kept
    # rows alone: their states are those of the whole forward, and every token's K/V is
    # written as before.
    _, ours, _, _ = tiny
    whole, whole_kv = _prefill(ours.model, None)
    kept, kept_kv = _prefill(ours.model, rows, narrowed)
    assert kept.shape == (len(rows), whole.shape[1])
    torch.testing.assert_close(kept, whole[rows], atol=1e-5, rtol=1e-5)
    assert torch.equal(kept_kv, whole_kv) and whole_kv.abs().sum() > 0


def test_block_size_does_not_change_tokens(tiny):
    _, ours, _, _ = tiny
    small, _ = greedy_decode_paged(ours.model, PROMPTS[1:3], num_tokens=8, block_size=1)
    large, _ = greedy_decode_paged(ours.model, PROMPTS[1:3], num_tokens=8, block_size=64)
    assert small == large


def test_window_and_soft_caps_matter(tiny):
    # Without its window and caps the model no longer matches on the long prompt, so the
    # parity above holds because they are honoured.
    _, ours, hf, _ = tiny
    layers = ours.model.attention_layers
    if all(a.sliding_window is None and a.logit_softcap is None for a in layers):
        pytest.skip("full attention without soft-capping")
    ours.model.attention_layers = tuple(
        dataclasses.replace(a, sliding_window=None, logit_softcap=None) for a in layers)
    try:
        _, (logits,) = greedy_decode_paged(ours.model, [PROMPTS[LONG]], num_tokens=1)
    finally:
        ours.model.attention_layers = layers
    assert (logits - _hf_logits(hf, PROMPTS[LONG])).abs().max() > 1e-2


def test_arch_reflects_the_checkpoint(tiny):
    _, ours, hf, _ = tiny
    arch, cfg = ours.arch, hf.config
    assert arch.architecture == cfg.architectures[0]
    assert arch.tie_word_embeddings == cfg.tie_word_embeddings
    assert arch.attention_bias == (arch.architecture == "Qwen2ForCausalLM")
    head_dim = 32 if arch.architecture == "Qwen3ForCausalLM" else 16
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == (4, 2, head_dim)
    windows = [a.sliding_window for a in ours.model.attention_layers]
    assert windows == [None if t == "full_attention" else getattr(cfg, "sliding_window", None)
                       for t in getattr(cfg, "layer_types", None) or ["sliding_attention"] * 2]
    assert windows[0] == (TINY_SLIDING_WINDOW if getattr(cfg, "sliding_window", None) else None)
    rope_type = (cfg.rope_parameters or {}).get("rope_type", "default")
    assert (arch.rope_scaling or {}).get("rope_type", "default") == rope_type
    if arch.architecture == "Gemma2ForCausalLM":
        assert ours.model.attention_layers[0].scale == 32 ** -0.5  # query_pre_attn_scalar
        assert (arch.attn_logit_softcap, arch.final_logit_softcap) == (2.0, 5.0)


def test_gguf_export_loads_with_the_same_logits(tiny, tmp_path, request):
    arch_name = request.node.callspec.params["tiny"]
    if arch_name not in GGUF_ARCHS:
        pytest.skip(f"{arch_name}: its rope scaling has no GGUF form hifc reads")
    from transformers import AutoModelForCausalLM
    path, ours, hf, _ = tiny
    gguf_path = export_gguf(hf, tmp_path / "tiny.gguf", name=f"tiny-{arch_name}")
    loaded = load_model(str(gguf_path), torch.float32, torch.device("cpu"))
    assert loaded.tokenizer is None  # the export writes no vocabulary
    assert loaded.arch.architecture == ours.arch.architecture
    reference = hf
    if arch_name == "gemma2":
        # GGUF does not carry query_pre_attn_scalar: llama.cpp (and hifc) scale by head_dim
        reference = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.float32, query_pre_attn_scalar=loaded.arch.head_dim).eval()
    _, prefill_logits = greedy_decode_paged(loaded.model, PROMPTS, num_tokens=1)
    for prompt, logits in zip(PROMPTS, prefill_logits):
        torch.testing.assert_close(logits, _hf_logits(reference, prompt), atol=1e-4, rtol=1e-4)
