"""GGUF files (llama.cpp): metadata -> ModelArchConfig, tensors -> dequantized HF-named tensors."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from hifc.models.config import ModelArchConfig

# GGUF general.architecture -> hifc architecture; llama.cpp stores Mistral as "llama".
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def open_gguf(path: Path) -> GGUFReader:
    try:
        return GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read GGUF file {path}: {exc}") from exc


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _require(reader: GGUFReader, key: str, path: Path) -> Any:
    value = _field(reader, key)
    if value is None:
        raise ValueError(f"{path}: GGUF metadata lacks {key!r}")
    return value


def gguf_eos_ids(reader: GGUFReader) -> tuple[int, ...]:
    """End-of-generation ids the file names: eos, and eot/eom where present (Llama 3)."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")
    return tuple(dict.fromkeys(int(v) for v in (_field(reader, k) for k in keys) if v is not None))


def _rope_scaling(reader: GGUFReader, prefix: str, path: Path) -> dict[str, Any] | None:
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError(f"{path}: GGUF rope frequency factors (rope_freqs.weight, Llama 3.1 "
                         f"scaling) are not supported; load the Hugging Face directory instead")
    rope_type = _field(reader, f"{prefix}.rope.scaling.type", "none")
    if rope_type == "none":
        return None
    return {"rope_type": rope_type, "factor": _field(reader, f"{prefix}.rope.scaling.factor")}


def gguf_arch(reader: GGUFReader, path: Path) -> ModelArchConfig:
    """The architecture a GGUF file describes; ValueError for unsupported ones."""
    gguf_arch_name = _require(reader, "general.architecture", path)
    if gguf_arch_name not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: unsupported GGUF architecture {gguf_arch_name!r}; hifc "
                         f"supports {', '.join(GGUF_ARCHITECTURES)}")
    architecture = GGUF_ARCHITECTURES[gguf_arch_name]
    if gguf_arch_name == "llama" and "mistral" in str(_field(reader, "general.name", "")).lower():
        architecture = "MistralForCausalLM"
    p = gguf_arch_name
    hidden = int(_require(reader, f"{p}.embedding_length", path))
    heads = int(_require(reader, f"{p}.attention.head_count", path))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = _field(reader, f"{p}.vocab_size", len(tokens.data) if tokens is not None else None)
    if vocab is None:
        raise ValueError(f"{path}: GGUF metadata gives no vocabulary size")
    head_dim = _field(reader, f"{p}.attention.key_length",
                      _field(reader, f"{p}.rope.dimension_count", hidden // heads))
    eos_ids = gguf_eos_ids(reader)
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    return ModelArchConfig(
        architecture=architecture,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_require(reader, f"{p}.feed_forward_length", path)),
        num_hidden_layers=int(_require(reader, f"{p}.block_count", path)),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, f"{p}.attention.head_count_kv", heads)),
        head_dim=int(head_dim),
        rms_norm_eps=float(_field(reader, f"{p}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, f"{p}.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(reader, p, path),
        max_position_embeddings=int(_field(reader, f"{p}.context_length", 4096)),
        tie_word_embeddings=all(t.name != "output.weight" for t in reader.tensors),
        attention_bias=architecture == "Qwen2ForCausalLM",
        sliding_window=_field(reader, f"{p}.attention.sliding_window"),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos_ids,
    )


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of RoPE halves in Q/K rows ([heads*D, ...] or [heads*D])."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def iter_gguf_weights(reader: GGUFReader, arch: ModelArchConfig,
                      dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in ``dtype``) for each tensor, dequantized and with Q/K rows restored."""
    permuted = arch.architecture != "Qwen2ForCausalLM"  # llama.cpp permutes llama-arch Q/K
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        if name is None:
            raise ValueError(f"GGUF tensor {tensor.name!r} has no counterpart in hifc's "
                             f"{arch.architecture}")
        values = dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(reversed([int(d) for d in tensor.shape]))  # ggml lists dims fastest first
        values = np.asarray(values, dtype=np.float32)
        if not values.flags.writeable:  # a view into the read-only file map
            values = values.copy()
        weight = torch.from_numpy(values).reshape(shape).to(dtype)
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            weight = _unpermute(weight, arch.num_attention_heads)
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            weight = _unpermute(weight, arch.num_key_value_heads)
        yield name, weight
