"""The engine's KV tensor, its sizing, and the scales of an FP8 KV cache.

An FP8 cache (``torch.float8_e4m3fn``, 1 byte per element: twice the tokens of a 16-bit cache
in the same bytes) holds ``x / scale`` and is read as ``fp8 * scale``, with one K and one V scale
per layer and KV head: the checkpoint's (``hifc.loader.kv_scales``), else 1.0 (vLLM's default).
The scales are fixed before any block is written: they are part of the model salt and of the
tier's file format through ``scale_digest`` (see ``hifc.tiers.geometry.KVGeometry``), so KV
written with one set of scales is never read with another. They are not computed from the first
prefill (vLLM's ``calculate_kv_scales``): such scales depend on which request came first, and so
would the salt: two engines on the same model would name the same prefix differently, and a
persistent prefix store would miss across runs.
"""
from __future__ import annotations

import hashlib

import torch

from hifc.models.config import ModelArchConfig

SCALE_DIGEST_BYTES = 16


def kv_bytes_per_block(arch: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block id occupies across all layers, K and V, in a cache of ``dtype``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_hidden_layers * block_size * arch.num_key_value_heads * arch.head_dim * itemsize


def allocate_kv_cache(arch: ModelArchConfig, num_blocks: int, block_size: int,
                      dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One tensor [L, 2, num_blocks, block_size, Hkv, D]; block (l, k, b) is contiguous."""
    shape = (arch.num_hidden_layers, 2, num_blocks, block_size, arch.num_key_value_heads,
             arch.head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


def kv_cache_scales(kv_dtype: torch.dtype, arch: ModelArchConfig,
                    checkpoint_scales: torch.Tensor | None,
                    device: torch.device) -> torch.Tensor | None:
    """The scales a cache of ``kv_dtype`` is read with: [L, 2 (K, V), Hkv] float32 on
    ``device`` for float8 (the checkpoint's, else 1.0), None for an unscaled dtype."""
    if kv_dtype != torch.float8_e4m3fn:
        return None
    shape = (arch.num_hidden_layers, 2, arch.num_key_value_heads)
    if checkpoint_scales is None:
        return torch.ones(shape, dtype=torch.float32, device=device)
    if tuple(checkpoint_scales.shape) != shape:
        raise ValueError(f"KV cache scales of shape {tuple(checkpoint_scales.shape)} for a model "
                         f"of shape {shape} (layers, K/V, KV heads)")
    return checkpoint_scales.to(device=device, dtype=torch.float32).contiguous()


def scale_digest(scales: torch.Tensor | None) -> str:
    """A hex digest of the scales ([L, 2, Hkv] float32), "" for none: what tier files and
    the model salt record of them."""
    if scales is None:
        return ""
    data = scales.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    shape = ",".join(map(str, scales.shape)).encode()
    return hashlib.blake2b(shape + b":" + data, digest_size=SCALE_DIGEST_BYTES).hexdigest()
