"""Which part of a tensor-parallel model this process holds, and the collectives its layers join.

Megatron-style sharding over ``size`` ranks: a column-parallel layer keeps ``1/size`` of its
output rows (its query and KV heads, its part of the MLP's intermediate features), a
row-parallel one the matching ``1/size`` of its input columns and sums the partial products
with an all-reduce; the vocabulary is split into ``size`` equal ranges (padded to a multiple of
``size``) for the embedding and the LM head, whose logits are gathered along the vocabulary.
With ``size`` 1 every collective is the identity and no process group is needed.

The collectives run on ``group`` (None: the default process group of ``torch.distributed``;
NCCL on GPUs, where they are captured inside the decode CUDA graphs, gloo on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# torch 2.13 renamed all_gather_into_tensor (deprecated there) to all_gather_single; the GPU
# machines run torch 2.11, which has only the old name
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class TPShard:
    """This process's place in a tensor-parallel model: rank ``rank`` of ``size``."""

    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside [0, {self.size})")

    def split(self, total: int) -> int:
        """This rank's share of ``total`` (which the model checks divides by ``size``)."""
        if total % self.size:
            raise ValueError(f"{total} does not divide into {self.size} tensor-parallel parts")
        return total // self.size

    def first(self, total: int) -> int:
        """Where this rank's share of ``total`` starts."""
        return self.rank * self.split(total)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks (in place)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """[N, C] on every rank -> [N, size * C]: rank r's columns at r * C, on every rank."""
        if self.size == 1:
            return x
        out = torch.empty((self.size * x.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
        _all_gather_single(out, x.contiguous(), group=self.group)  # [size * N, C]
        return out.view(self.size, x.shape[0], x.shape[1]).transpose(0, 1).reshape(
            x.shape[0], self.size * x.shape[1])


SINGLE = TPShard()  # the whole model in one process


def check_divides(arch, size: int) -> None:
    """ValueError unless a model of ``arch`` (a ModelArchConfig) splits over ``size`` ranks:
    its query heads, KV heads and MLP width must divide by ``size`` (KV heads are not
    replicated: fewer KV heads than ranks is refused)."""
    if size == 1:
        return
    parts = {"attention heads (num_attention_heads)": arch.num_attention_heads,
             "KV heads (num_key_value_heads)": arch.num_key_value_heads,
             "MLP width (intermediate_size)": arch.intermediate_size}
    bad = [f"{count} {name}" for name, count in parts.items() if count % size]
    if bad:
        raise ValueError(f"tensor_parallel_size={size} must divide the model's "
                         f"{' and '.join(bad)}; choose a size that divides them")
