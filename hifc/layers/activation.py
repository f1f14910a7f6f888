"""Gated activations over a merged gate/up projection: SwiGLU (SiLU) and GeGLU (tanh GELU)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from hifc.layers import triton_fused


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for gate_up = [gate | up] ([T, 2I]); returns [T, I]. Fused on CUDA."""
    if triton_fused.usable(gate_up):
        return triton_fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` for gate_up = [gate | up] ([T, 2I]); returns [T, I] (Gemma)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


# Hugging Face hidden_act name -> the gated activation over [gate | up]
GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": silu_and_mul,
    "gelu_pytorch_tanh": gelu_tanh_and_mul,
}
