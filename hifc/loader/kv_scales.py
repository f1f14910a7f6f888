"""KV cache scales in Hugging Face checkpoints: the dequantisation scales of an FP8 KV cache.

A checkpoint quantised for an FP8 KV cache (llm-compressor's ``kv_cache_scheme``, NVIDIA
ModelOpt, vLLM's older exports) carries, per attention layer, a K and a V scale: the cache holds
``x / scale`` in float8_e4m3fn and attention reads ``fp8 * scale``. The names vLLM reads:

    model.layers.{i}.self_attn.k_scale / v_scale              (compressed-tensors)
    model.layers.{i}.self_attn.k_proj.k_scale / v_proj.v_scale (ModelOpt)
    model.layers.{i}.self_attn.kv_scale                       (older: one scale for K and V)

A scale is one value (per layer) or one per KV head (per head). Anything else, scales for only
some layers, or values that are not finite and positive raise a ValueError naming the tensor.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch

_SCALE_NAME = re.compile(
    r"^model\.layers\.(\d+)\.self_attn\.(?:[kv]_proj\.)?(k_scale|v_scale|kv_scale)$")


class KVScaleCollector:
    """Takes the KV scale tensors out of a checkpoint's weight stream (``split``) and, once the
    stream is read, gives them as one tensor (``scales``)."""

    def __init__(self) -> None:
        self._found: dict[tuple[int, str], tuple[str, torch.Tensor]] = {}

    def split(self, weights: Iterable[tuple[str, torch.Tensor]]
              ) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights without the KV scales, which are kept."""
        for name, tensor in weights:
            match = _SCALE_NAME.match(name)
            if match is None:
                yield name, tensor
                continue
            layer, kind = int(match.group(1)), match.group(2)
            if (layer, kind) in self._found:
                raise ValueError(f"checkpoint has two {kind} tensors for layer {layer}: "
                                 f"{self._found[layer, kind][0]!r} and {name!r}")
            self._found[layer, kind] = (name, tensor)

    def scales(self, num_layers: int, num_kv_heads: int) -> torch.Tensor | None:
        """[num_layers, 2 (K, V), num_kv_heads] float32 on the CPU, or None if the checkpoint
        has no KV scales."""
        if not self._found:
            return None
        beyond = sorted(layer for layer, _ in self._found if layer >= num_layers)
        if beyond:
            raise ValueError(f"checkpoint has KV cache scales for layer {beyond[0]}, but the "
                             f"model has {num_layers} layers")
        out = torch.empty(num_layers, 2, num_kv_heads, dtype=torch.float32)
        for layer in range(num_layers):
            for index, kind in enumerate(("k_scale", "v_scale")):
                name, tensor = self._lookup(layer, kind)
                out[layer, index] = _per_head(name, tensor, num_kv_heads)
        return out

    def _lookup(self, layer: int, kind: str) -> tuple[str, torch.Tensor]:
        own, shared = self._found.get((layer, kind)), self._found.get((layer, "kv_scale"))
        if own is not None and shared is not None:
            raise ValueError(f"checkpoint has both {own[0]!r} and {shared[0]!r}")
        if own is None and shared is None:
            raise ValueError(f"checkpoint has KV cache scales, but none ({kind}) for layer "
                             f"{layer}")
        return own or shared


def _per_head(name: str, tensor: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """One scale per KV head ([num_kv_heads] float32) from a per-layer or per-head scale."""
    if not tensor.is_floating_point():
        raise ValueError(f"KV cache scale {name!r} has dtype {tensor.dtype}, not a float")
    values = tensor.detach().to(torch.float32).flatten()
    dims = [d for d in tensor.shape if d != 1]
    if values.numel() == 1:
        values = values.expand(num_kv_heads)
    elif dims != [num_kv_heads]:
        raise ValueError(f"KV cache scale {name!r} has shape {tuple(tensor.shape)}; hifc reads "
                         f"one scale per layer or one per KV head ({num_kv_heads})")
    if not (torch.isfinite(values).all() and (values > 0).all()):
        raise ValueError(f"KV cache scale {name!r} holds values that are not finite and "
                         f"positive: {values.tolist()}")
    return values
