"""RMSNorm with an optional fused residual add (one call per sub-layer boundary)."""
from __future__ import annotations

import torch
from torch import nn

from hifc.layers import triton_fused


class RMSNorm(nn.Module):
    """``weight * x / rms(x)`` as Hugging Face Llama computes it (normalized in float32, cast
    back, then scaled), or with unit_offset ``(1 + weight) * x / rms(x)`` as Gemma computes it
    (scaled in float32, cast once). The weight is stored as the checkpoint stores it."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype, device: torch.device,
                 unit_offset: bool = False):
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.full((hidden_size,), self.identity_weight, dtype=dtype,
                                              device=device), requires_grad=False)  # [H]

    @property
    def identity_weight(self) -> float:
        """The weight value that scales by one."""
        return 0.0 if self.unit_offset else 1.0

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize ``x + residual`` (or ``x``) over the last dim; x, residual: [..., H].

        Returns ``(normed, summed)``: summed is the residual stream the next sub-layer's output
        is added to. On CUDA one fused Triton kernel does it all (same rounding).
        """
        if triton_fused.usable(x):
            return triton_fused.rms_norm(x, self.weight, self.eps, residual, self.unit_offset)
        if residual is not None:
            x = x + residual
        input_dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)  # [..., 1]
        h = h * torch.rsqrt(variance + self.eps)
        if self.unit_offset:
            return (h * (1.0 + self.weight.float())).to(input_dtype), x
        return self.weight * h.to(input_dtype), x
