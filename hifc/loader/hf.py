"""Hugging Face model directories: config.json -> ModelArchConfig, safetensors -> tensors."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError, safe_open

from hifc.layers.rotary import check_rope_scaling, rope_type_of
from hifc.models.config import SUPPORTED_ARCHITECTURES, ModelArchConfig

_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "mistral": "MistralForCausalLM"}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc


def _architecture(cfg: dict[str, Any], path: Path) -> str:
    names = cfg.get("architectures") or [_MODEL_TYPES.get(cfg.get("model_type"),
                                                          cfg.get("model_type"))]
    supported = [name for name in names if name in SUPPORTED_ARCHITECTURES]
    if not supported:
        raise ValueError(f"{path}: unsupported architecture {', '.join(map(str, names))}; "
                         f"hifc supports {', '.join(SUPPORTED_ARCHITECTURES)}")
    return supported[0]


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either the classic keys or transformers 5's rope_parameters."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = cfg.get("rope_theta", params.pop("rope_theta", 10000.0))
    scaling = dict(cfg.get("rope_scaling") or params)
    scaling.pop("rope_theta", None)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if rope_type_of(scaling) == "default":
        return float(theta), None
    check_rope_scaling(scaling)
    return float(theta), scaling


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)


def arch_from_hf_config(cfg: dict[str, Any], path: Path,
                        generation_cfg: dict[str, Any] | None = None) -> ModelArchConfig:
    """Translate a config.json (plus generation_config.json) into a ModelArchConfig."""
    architecture = _architecture(cfg, path)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{path}: unsupported hidden_act {cfg['hidden_act']!r} (only silu)")
    if architecture == "LlamaForCausalLM" and (cfg.get("attention_bias") or cfg.get("mlp_bias")):
        raise ValueError(f"{path}: Llama attention_bias/mlp_bias checkpoints are not supported")
    heads = cfg["num_attention_heads"]
    theta, scaling = _rope(cfg)
    sliding_window = None
    if architecture == "MistralForCausalLM" or cfg.get("use_sliding_window"):
        sliding_window = cfg.get("sliding_window")
    eos = _ids(cfg.get("eos_token_id")) + _ids((generation_cfg or {}).get("eos_token_id"))
    return ModelArchConfig(
        architecture=architecture,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=architecture == "Qwen2ForCausalLM",
        sliding_window=sliding_window,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(eos)),
    )


def read_hf_arch(model_dir: Path) -> ModelArchConfig:
    """The architecture of a Hugging Face model directory."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    generation_path = model_dir / "generation_config.json"
    generation_cfg = _read_json(generation_path) if generation_path.is_file() else None
    try:
        return arch_from_hf_config(_read_json(config_path), model_dir, generation_cfg)
    except KeyError as exc:
        raise ValueError(f"{config_path}: missing field {exc.args[0]!r}") from exc


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
