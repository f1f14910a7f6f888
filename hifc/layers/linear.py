"""Linear layers that own how checkpoint tensors fill their weights.

A checkpoint may store a projection whole or as shards that hifc merges into one matrix (q/k/v
into ``qkv_proj``, gate/up into ``gate_up_proj``: one launch instead of three or two). Each layer
knows which rows of its weight a shard fills, so that tensor parallelism only has to change these
classes: a column-parallel layer would keep its slice of the output rows of every shard, a
row-parallel one its slice of the input columns. All of them hold the whole matrix today.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Which shard of a merged layer a checkpoint tensor is: "q" / "k" / "v" (QKVLinear), an index
# (MergedColumnLinear), or None for the layer's whole tensor.
ShardId = str | int | None


@torch.no_grad()
def copy_weight(dst: torch.Tensor, loaded: torch.Tensor) -> None:
    """dst <- loaded, cast to dst's dtype and device; ValueError if the shapes differ."""
    if tuple(dst.shape) != tuple(loaded.shape):
        raise ValueError(f"has shape {tuple(loaded.shape)}, the model expects {tuple(dst.shape)}")
    dst.copy_(loaded)


class Linear(nn.Module):
    """``y = x W^T (+ b)``; weights stay uninitialized until loaded or randomly initialized."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype,
                                               device=device), requires_grad=False)  # [O, I]
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device),
                                  requires_grad=False) if bias else None)  # [O]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")

    def shard_rows(self, shard: ShardId) -> tuple[int, int]:
        """(first row, rows) of the output that ``shard`` fills (here only the whole)."""
        if shard is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard!r}")
        return 0, self.out_features

    def load_weight(self, param: nn.Parameter, loaded: torch.Tensor, shard: ShardId) -> None:
        """Copy a checkpoint tensor (whole, or one shard) into ``param`` (weight or bias);
        ValueError if its shape does not fit."""
        first, rows = self.shard_rows(shard)
        copy_weight(param.narrow(0, first, rows), loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # [T, O]


class ColumnLinear(Linear):
    """Output features would be split across GPUs (each rank computes some outputs)."""


class RowLinear(Linear):
    """Input features would be split across GPUs (each rank's partial sums are reduced)."""


class MergedColumnLinear(ColumnLinear):
    """Several column layers over one input stacked into one matrix (e.g. gate and up);
    checkpoint shard i fills rows ``sum(output_sizes[:i]) ..`` of it."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, dtype: torch.dtype,
                 device: torch.device):
        super().__init__(in_features, sum(output_sizes), bias, dtype, device)
        self.output_sizes = list(output_sizes)

    def shard_rows(self, shard: ShardId) -> tuple[int, int]:
        if shard is None:
            return 0, self.out_features
        if not (isinstance(shard, int) and 0 <= shard < len(self.output_sizes)):
            raise ValueError(f"{type(self).__name__} has no shard {shard!r}")
        return sum(self.output_sizes[:shard]), self.output_sizes[shard]


class QKVLinear(MergedColumnLinear):
    """The query, key and value projections as one matrix: rows [q | k | v]."""

    SHARDS = ("q", "k", "v")

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, dtype: torch.dtype, device: torch.device):
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        super().__init__(hidden_size, [self.q_size, self.kv_size, self.kv_size], bias, dtype,
                         device)

    def shard_rows(self, shard: ShardId) -> tuple[int, int]:
        if shard is not None and shard not in self.SHARDS:
            raise ValueError(f"QKVLinear has no shard {shard!r}")
        return super().shard_rows(None if shard is None else self.SHARDS.index(shard))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [T, H] -> q [T, Hq*D], k [T, Hkv*D], v [T, Hkv*D] (views of one output)."""
        qkv = super().forward(x)  # [T, (Hq + 2 Hkv) D]
        return qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
