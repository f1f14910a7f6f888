"""Rotary position embedding (Hugging Face rotate-half convention), with Llama-3, linear and
LongRoPE (Phi-3) scaling.

cos/sin are precomputed once for positions ``[0, max_positions)`` in the model dtype and indexed
by each step's ``positions``, so a step does no trigonometry (and stays CUDA-graph friendly).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hifc.layers import triton_fused

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")


def rope_type_of(rope_scaling: dict[str, Any] | None) -> str:
    """The scaling kind of an HF-style rope_scaling dict ("default" when there is none)."""
    if not rope_scaling:
        return "default"
    return rope_scaling.get("rope_type", rope_scaling.get("type", "default"))


def check_rope_scaling(rope_scaling: dict[str, Any] | None) -> None:
    """Raise ValueError if the scaling kind is not one hifc implements, or lacks its fields."""
    rope_type = rope_type_of(rope_scaling)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; hifc supports "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    required = {"default": (), "linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                           "original_max_position_embeddings"),
                "longrope": ("short_factor", "long_factor",
                             "original_max_position_embeddings")}[rope_type]
    missing = [key for key in required if key not in rope_scaling]
    if missing:
        raise ValueError(f"rope_scaling of type {rope_type!r} lacks {', '.join(missing)}")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths / factor, short kept, smooth in between."""
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def compute_inv_freq(head_dim: int, base: float,
                     rope_scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies ([D/2] float32, on CPU), bit-identical to transformers' computation
    (for longrope: those of positions within original_max_position_embeddings)."""
    check_rope_scaling(rope_scaling)
    exponents = _exponents(head_dim)
    rope_type = rope_type_of(rope_scaling)
    if rope_type == "longrope":
        return _longrope_inv_freq(exponents, base, rope_scaling["short_factor"])
    inv_freq = 1.0 / (base ** exponents)  # [D/2]
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    return inv_freq


def _exponents(head_dim: int) -> torch.Tensor:
    """2i / D for i < D/2 ([D/2] float32): the frequency exponents of base."""
    return torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim


def _longrope_inv_freq(exponents: torch.Tensor, base: float,
                       factors: list[float]) -> torch.Tensor:
    """LongRoPE: each frequency divided by its own rescale factor ([D/2])."""
    return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base ** exponents)


def _longrope_attention_factor(scaling: dict[str, Any]) -> float:
    """The factor cos and sin are multiplied by (the LongRoPE paper's, unless given). ``factor``
    is the context extension (transformers: max_position_embeddings / the original)."""
    factor = scaling.get("factor") or 1.0
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(scaling["original_max_position_embeddings"]))


def rope_angles(head_dim: int, max_positions: int, base: float,
                rope_scaling: dict[str, Any] | None,
                device: torch.device) -> tuple[torch.Tensor, float]:
    """(angles [P, D/2] float32, factor for cos and sin) of positions 0 .. max_positions - 1.

    LongRoPE takes the short factors below original_max_position_embeddings and the long ones
    from there on, per position (transformers switches by the length of the whole sequence: the
    same for every sequence that fits the original context)."""
    t = torch.arange(max_positions, device=device, dtype=torch.float32)[:, None]  # [P, 1]
    inv_freq = compute_inv_freq(head_dim, base, rope_scaling).to(device)  # [D/2]
    if rope_type_of(rope_scaling) != "longrope":
        return t * inv_freq[None, :], 1.0
    long_inv_freq = _longrope_inv_freq(_exponents(head_dim), base,
                                       rope_scaling["long_factor"]).to(device)
    is_long = t >= rope_scaling["original_max_position_embeddings"]  # [P, 1]
    angles = t * torch.where(is_long, long_inv_freq[None, :], inv_freq[None, :])
    return angles, _longrope_attention_factor(rope_scaling)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to q ([T, Hq, D]) and k ([T, Hkv, D]) at the given positions ([T])."""

    def __init__(self, head_dim: int, max_positions: int, base: float,
                 rope_scaling: dict[str, Any] | None, dtype: torch.dtype, device: torch.device):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        angles, factor = rope_angles(head_dim, max_positions, base, rope_scaling, device)
        cos, sin = angles.cos(), angles.sin()  # [P, D/2]
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        self.register_buffer("cos_cache", cos.to(dtype), persistent=False)  # [P, D/2]
        self.register_buffer("sin_cache", sin.to(dtype), persistent=False)  # [P, D/2]

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated copies of q and k (one fused Triton kernel on CUDA, same rounding)."""
        if triton_fused.usable(q):
            return triton_fused.rotary(positions, q, k, self.cos_cache, self.sin_cache)
        cos = self.cos_cache[positions].unsqueeze(1)  # [T, 1, D/2]
        sin = self.sin_cache[positions].unsqueeze(1)  # [T, 1, D/2]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for x = [x1 | x2] ([T, H, D])."""
    x1, x2 = x.chunk(2, dim=-1)  # [T, H, D/2] each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
