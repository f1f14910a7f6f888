"""SwiGLU activation over a merged gate/up projection."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hifc.layers import triton_fused


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for gate_up = [gate | up] ([T, 2I]); returns [T, I]. Fused on CUDA."""
    if triton_fused.usable(gate_up):
        return triton_fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
