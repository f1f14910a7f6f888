"""Model config overrides (vLLM's ``hf_overrides``): values that replace the architecture's own
before the model is built, e.g. ``{"num_hidden_layers": 2}`` for a model of its first 2 layers.

Keys are ``ModelArchConfig`` field names, which are the Hugging Face config keys where one
exists; the Hugging Face spellings of the others are taken too (``architectures``, a list of
one name; ``eos_token_id``; ``attn_logit_softcapping``; ``final_logit_softcapping``).
Overrides apply the same way to a Hugging Face directory, a GGUF file and a random preset. A
smaller ``num_hidden_layers`` keeps the first layers (and their ``layer_types``); the
checkpoint's later layers are not loaded.
"""
from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from types import MappingProxyType
from typing import Any, Iterable, Iterator

import torch

from hifc.models.config import ModelArchConfig

# Hugging Face config key -> the ModelArchConfig field it sets, where the names differ
HF_ALIASES = MappingProxyType({
    "architectures": "architecture", "eos_token_id": "eos_token_ids",
    "attn_logit_softcapping": "attn_logit_softcap",
    "final_logit_softcapping": "final_logit_softcap"})
_TUPLE_FIELDS = ("eos_token_ids", "layer_types")
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")
_FIELD_TYPES = typing.get_type_hints(ModelArchConfig)


def override_keys() -> list[str]:
    """Every key an override may set."""
    return sorted({f.name for f in dataclasses.fields(ModelArchConfig)} | set(HF_ALIASES))


def apply_overrides(arch: ModelArchConfig, overrides: str | None) -> ModelArchConfig:
    """``arch`` with ``overrides`` (a JSON object's text, as ``EngineConfig.hf_overrides``
    holds it) applied; ValueError naming an unknown key, a key set twice, or the key or rule a
    value breaks."""
    if overrides is None:
        return arch
    given = json.loads(overrides)
    keys = override_keys()
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise ValueError(f"hf_overrides: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"keys: {', '.join(keys)}")
    changes = {}
    for key, value in given.items():
        name = HF_ALIASES.get(key, key)
        if name in changes:
            raise ValueError(f"hf_overrides sets {name} twice ({key!r} is another name for it)")
        if name == "architecture" and key == "architectures":
            if not (isinstance(value, list) and len(value) == 1):
                raise ValueError(f"hf_overrides: architectures must be a list of one name, got "
                                 f"{value!r}")
            value = value[0]
        elif name == "eos_token_ids" and isinstance(value, int):
            value = (value,)
        elif name in _TUPLE_FIELDS and isinstance(value, list):
            value = tuple(value)
        changes[name] = _typed(key, value, _FIELD_TYPES[name])
    layers = changes.get("num_hidden_layers", arch.num_hidden_layers)
    if "layer_types" not in changes and arch.layer_types is not None \
            and layers < len(arch.layer_types):
        changes["layer_types"] = arch.layer_types[:layers]
    return dataclasses.replace(arch, **changes)


def _typed(key: str, value: Any, hint: Any) -> Any:
    """``value`` if the field's type ``hint`` admits it (an int as a float where a float is
    asked for); ValueError if not."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    for option in typing.get_args(hint) if union else (hint,):
        base = typing.get_origin(option) or option
        if value is None and base is type(None):
            return value
        if isinstance(value, bool) and base is not bool:
            continue  # JSON true is no number
        if base is float and isinstance(value, int):
            return float(value)
        if isinstance(value, base):
            return value
    raise ValueError(f"hf_overrides: {key} cannot be {value!r}")


def first_layers(weights: Iterable[tuple[str, torch.Tensor]], num_layers: int
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors without those of layers ``num_layers`` and later."""
    for name, tensor in weights:
        match = _LAYER_NAME.match(name)
        if match is None or int(match.group(1)) < num_layers:
            yield name, tensor
