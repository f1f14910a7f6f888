"""GGUF files (llama.cpp): metadata -> ModelArchConfig, tensors -> dequantized HF-named tensors."""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from hifc.models.config import ModelArchConfig
from hifc.models.registry import ArchitectureSpec, gguf_arch_names, spec_for, spec_for_gguf

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# "<arch>.<key>" metadata every architecture writes alike -> transformers config field
_COMMON_METADATA = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
_REQUIRED_METADATA = ("embedding_length", "attention.head_count", "feed_forward_length",
                      "block_count")


def open_gguf(path: Path) -> GGUFReader:
    """The file's reader (read-only: metadata and memory-mapped tensors). Parsing the
    metadata takes seconds for a tokenizer's vocabulary, so an unchanged file (same size and
    modification time) is parsed once per process for the two most recent files."""
    try:
        stat = os.stat(path)
        return _reader(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read GGUF file {path}: {exc}") from exc


@functools.lru_cache(maxsize=2)
def _reader(path: str, size: int, mtime_ns: int) -> GGUFReader:
    return GGUFReader(path)


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
    if any(t.name.startswith(("rope_freqs", "rope_factors")) for t in reader.tensors):
        raise ValueError(f"{path}: GGUF rope frequency factors (rope_freqs / rope_factors "
                         f"tensors: Llama 3.1 or LongRoPE scaling) are not supported; load the "
                         f"Hugging Face directory instead")
    rope_type = _field(reader, f"{prefix}.rope.scaling.type", "none")
    if rope_type == "none":
        return None
    return {"rope_type": rope_type, "factor": _field(reader, f"{prefix}.rope.scaling.factor")}


def _hf_config_fields(reader: GGUFReader, spec: ArchitectureSpec, prefix: str,
                      path: Path) -> dict[str, Any]:
    """The transformers config fields the GGUF metadata gives."""
    for key in _REQUIRED_METADATA:
        _require(reader, f"{prefix}.{key}", path)
    names = {**_COMMON_METADATA, **spec.gguf.metadata}
    fields = {hf: value for key, hf in names.items()
              if (value := _field(reader, f"{prefix}.{key}")) is not None}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if "vocab_size" not in fields:
        if tokens is None:
            raise ValueError(f"{path}: GGUF metadata gives no vocabulary size")
        fields["vocab_size"] = len(tokens.data)
    fields["head_dim"] = _field(reader, f"{prefix}.attention.key_length", _field(
        reader, f"{prefix}.rope.dimension_count",
        fields["hidden_size"] // fields["num_attention_heads"]))
    fields.setdefault("sliding_window", None)  # not a config class's default (Mistral: 4096)
    fields["rope_scaling"] = _rope_scaling(reader, prefix, path)
    fields["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    fields["bos_token_id"] = _field(reader, "tokenizer.ggml.bos_token_id")
    fields["eos_token_id"] = list(gguf_eos_ids(reader))
    if spec.gguf.derived_config is not None:
        fields.update(spec.gguf.derived_config(fields))
    return fields


def gguf_arch(reader: GGUFReader, path: Path) -> ModelArchConfig:
    """The architecture a GGUF file describes, read through transformers' config class for it;
    ValueError for unsupported ones."""
    from transformers import AutoConfig

    gguf_arch_name = _require(reader, "general.architecture", path)
    spec = spec_for_gguf(gguf_arch_name, str(_field(reader, "general.name", "")))
    if spec is None:
        raise ValueError(f"{path}: unsupported GGUF architecture {gguf_arch_name!r}; hifc "
                         f"supports {', '.join(gguf_arch_names())}")
    config = AutoConfig.for_model(spec.model_type,
                                  **_hf_config_fields(reader, spec, gguf_arch_name, path))
    return spec.arch_from_hf(config, spec.name)


def _hf_name(gguf_name: str, spec: ArchitectureSpec) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in spec.gguf.block_tensors:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{spec.gguf.block_tensors[part]}.{kind}"


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaving of RoPE halves in Q/K rows ([heads*D, ...] or [heads*D])."""
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def iter_gguf_weights(reader: GGUFReader, arch: ModelArchConfig,
                      dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in ``dtype``) for each tensor, dequantized, with Q/K rows and norm
    weights restored where llama.cpp changed them."""
    spec = spec_for(arch.architecture)
    naming = spec.gguf
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, spec)
        if name is None:
            raise ValueError(f"GGUF tensor {tensor.name!r} has no counterpart in hifc's "
                             f"{arch.architecture}")
        values = dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(reversed([int(d) for d in tensor.shape]))  # ggml lists dims fastest first
        values = np.asarray(values, dtype=np.float32)
        if not values.flags.writeable:  # a view into the read-only file map
            values = values.copy()
        weight = torch.from_numpy(values).reshape(shape)  # float32
        if naming.permuted_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            weight = _unpermute(weight, arch.num_attention_heads)
        elif naming.permuted_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            weight = _unpermute(weight, arch.num_key_value_heads)
        elif naming.norm_offset and name.endswith("norm.weight"):
            weight = weight - naming.norm_offset
        yield name, weight.to(dtype)
