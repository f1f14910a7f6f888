"""Hugging Face model directories: config.json (through transformers' config classes) ->
ModelArchConfig, safetensors -> tensors."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open

from hifc.models.config import ModelArchConfig, token_ids
from hifc.models.registry import arch_from_hf_config


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc


def _generation_eos_ids(model_dir: Path) -> tuple[int, ...]:
    """The eos ids of generation_config.json, if the directory has one."""
    if not (model_dir / "generation_config.json").is_file():
        return ()
    from transformers import GenerationConfig
    try:
        generation = GenerationConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {model_dir / 'generation_config.json'}: {exc}") from exc
    return token_ids(generation.eos_token_id)


def read_hf_arch(model_dir: Path) -> ModelArchConfig:
    """The architecture of a Hugging Face model directory, read through transformers' config
    class for it; eos ids from config.json and generation_config.json together."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    from transformers import AutoConfig
    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"cannot read {config_path}: {exc}") from exc
    arch = arch_from_hf_config(config, f"{config_path}: ")
    eos = arch.eos_token_ids + _generation_eos_ids(model_dir)
    return dataclasses.replace(arch, eos_token_ids=tuple(dict.fromkeys(eos)))


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files: from model.safetensors.index.json when sharded, else *.safetensors."""
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.is_file():
        weight_map = _read_json(index_path).get("weight_map", {})
        files = [model_dir / name for name in dict.fromkeys(weight_map.values())]
        absent = [str(f.name) for f in files if not f.is_file()]
        if absent:
            raise ValueError(f"missing weights: {model_dir} lacks shard(s) {', '.join(absent)} "
                             f"named in {index_path.name}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"missing weights: {model_dir} has no *.safetensors files "
                         f"(hifc reads safetensors only)")
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor in the files, read lazily on the CPU; ValueError naming
    a file that is not valid safetensors (corrupt or truncated)."""
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except SafetensorError as exc:
            raise ValueError(f"cannot read weights {path}: {exc}") from exc
