"""RMSNorm with an optional fused residual add (one call per sub-layer boundary)."""
from __future__ import annotations

import torch
from torch import nn

from hifc.layers import triton_fused


class RMSNorm(nn.Module):
    """``weight * x / rms(x)``, computed in float32 and cast back, as Hugging Face Llama does."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)  # [H]

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize ``x + residual`` (or ``x``); x, residual: [T, H].

        Returns ``(normed, summed)``: summed ([T, H]) is the residual stream the next sub-layer's
        output is added to. On CUDA one fused Triton kernel does it all (same rounding).
        """
        if triton_fused.usable(x):
            return triton_fused.rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
        input_dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)  # [T, 1]
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(input_dtype), x
