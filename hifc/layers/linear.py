"""Linear layers that own how checkpoint tensors fill their weights, and how they split across
tensor-parallel ranks (:mod:`hifc.layers.tensor_parallel`).

A checkpoint may store a projection whole or as shards that hifc merges into one matrix (q/k/v
into ``qkv_proj``, gate/up into ``gate_up_proj``: one launch instead of three or two). Each layer
knows which rows of its weight a shard fills and which part of it this rank keeps:

- a column-parallel layer (``MergedColumnLinear``, ``QKVLinear``) keeps ``1/tp`` of the output
  rows of every part it stacks: rank r holds ``[gate_r | up_r]`` or ``[q heads_r | k heads_r |
  v heads_r]``, so its output is this rank's heads or intermediate features, nothing gathered;
- a row-parallel layer (``RowLinear``) keeps the matching ``1/tp`` of the input columns and sums
  the ranks' partial products with an all-reduce (its bias, if any, added once after the sum).

With one rank (the default) every layer holds the whole matrix and runs no collective.

A decode step of up to 16 sequences, or of 25-32, runs each projection through Triton
kernels that stream the weight (``linear``, :mod:`hifc.layers.triton_gemv`); at batch 1 the
column layers' ``forward_normed`` and the row layer's ``forward_gated`` let the GEMV compute the
RMSNorm or the SiLU-and-mul before it as it reads its input (one launch instead of two), and
``project_then_norm`` lets a row GEMV add the residual after it and the next column GEMV
normalize that sum (two launches instead of three).

Other products of more than 16 rows run through the kernel ``tune_projections`` chose for
their shape by timing (:mod:`hifc.layers.gemm_tuning`); untuned ones of up to ``LT_MAX_ROWS`` rows
(decode batches, short prompts) through torch's cuBLASLt path, which reads the weights faster
there than its default cuBLAS path, and longer ones (prompts) through cuBLAS, faster for them
(docs/RESULTS.md). A CUDA graph keeps the kernel chosen at capture.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from hifc.layers import cublaslt, gemm_tuning, triton_gemv
from hifc.layers.activation import GATED_ACTIVATIONS
from hifc.layers.norm import RMSNorm
from hifc.layers.tensor_parallel import SINGLE, TPShard

# Which shard of a merged layer a checkpoint tensor is: "q" / "k" / "v" (QKVLinear), an index
# (MergedColumnLinear), or None for the layer's whole tensor.
ShardId = str | int | None


@torch.no_grad()
def copy_weight(dst: torch.Tensor, loaded: torch.Tensor) -> None:
    """dst <- loaded, cast to dst's dtype and device; ValueError if the shapes differ."""
    if tuple(dst.shape) != tuple(loaded.shape):
        raise ValueError(f"has shape {tuple(loaded.shape)}, the model expects {tuple(dst.shape)}")
    dst.copy_(loaded)


# Untuned inputs of MAX_ROWS + 1 .. LT_MAX_ROWS rows on CUDA run through cuBLASLt (module doc).
LT_MAX_ROWS = 128


def prefers_cublaslt(x: torch.Tensor) -> bool:
    """Whether ``linear`` runs ``x`` through cuBLASLt when untuned and the small-M kernel does
    not take it: a decode batch of more than MAX_ROWS and at most LT_MAX_ROWS rows on CUDA."""
    return (x.is_cuda and x.dim() == 2 and x.shape[0] > triton_gemv.MAX_ROWS
            and _untuned_path(x.shape[0]) == gemm_tuning.CUBLASLT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T (+ b)``: one row on CUDA through the Triton GEMV, a few rows (``takes_rows``)
    through its small-M kernel (both faster than cuBLAS there), others by the kernel tuned for
    the shape, else decode batches through cuBLASLt and the rest through ``F.linear``
    (cuBLAS)."""
    if triton_gemv.usable(x, weight):
        return triton_gemv.gemv(x, weight, bias)
    if triton_gemv.usable_rows(x, weight):
        return triton_gemv.gemm_rows(x, weight, bias)
    y = gemm_tuning.run(x, weight, bias)
    if y is not None:
        return y
    if prefers_cublaslt(x):
        with cublaslt.torch_preference("cublaslt"):
            return F.linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _untuned_path(m: int) -> str:
    """The library ``linear`` runs an untuned product of m (> MAX_ROWS) rows on CUDA through."""
    return gemm_tuning.CUBLASLT if m <= LT_MAX_ROWS else gemm_tuning.CUBLAS


def tune_projections(model: nn.Module, rows: list[int]) -> list[gemm_tuning.Tuned]:
    """Time and choose the kernel of every projection shape of ``model`` (on CUDA, in float16
    or bfloat16) at each row count of ``rows`` past MAX_ROWS (:mod:`hifc.layers.gemm_tuning`;
    at 25-32 rows the choice serves only weights the small-M kernel does not take), or take
    the choices an earlier process made for these shapes on this kind of GPU."""
    groups: dict[tuple, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
    for module in model.modules():
        if (isinstance(module, Linear) and module.weight.is_cuda
                and module.weight.dtype in cublaslt.DTYPES):
            bias = module.local_bias if isinstance(module, RowLinear) else module.bias
            weight = module.weight
            key = (weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
            groups.setdefault(key, []).append((weight, bias))
    rows = [m for m in rows if m > triton_gemv.MAX_ROWS]
    if not groups or not rows:
        return []
    return gemm_tuning.tune(groups, rows, _untuned_path, gemm_tuning.choice_file(groups))


def check_shape(loaded: torch.Tensor, expected: tuple[int, ...]) -> None:
    """ValueError unless a whole checkpoint tensor has the model's (unsplit) shape."""
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(f"has shape {tuple(loaded.shape)}, the model expects {tuple(expected)}")


class Linear(nn.Module, ABC):
    """``y = x W^T (+ b)`` over this rank's part of the weight; uninitialized until loaded."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device, tp: TPShard = SINGLE):
        """in_features, out_features: this rank's (the subclasses split the model's)."""
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype,
                                               device=device), requires_grad=False)  # [O, I]
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device),
                                  requires_grad=False) if bias else None)  # [O]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, tp={self.tp.rank}/{self.tp.size}")

    @abstractmethod
    def load_weight(self, param: nn.Parameter, loaded: torch.Tensor, shard: ShardId) -> None:
        """Copy this rank's part of a checkpoint tensor (whole, or one shard) into ``param``
        (weight or bias); ValueError if its shape does not fit the model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outputs(linear(x, self.weight, self.bias))

    def outputs(self, y: torch.Tensor):
        """What forward returns of the product y ([T, O]): y itself here."""
        return y


class MergedColumnLinear(Linear):
    """Column layers over one input stacked into one matrix (e.g. gate and up), each split
    alike across the ranks: checkpoint shard i fills, on rank r, rows
    ``sum(local_sizes[:i]) ..`` with its rows ``r * local_sizes[i] ..``."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool,
                 dtype: torch.dtype, device: torch.device, tp: TPShard = SINGLE):
        self.output_sizes = list(output_sizes)  # the model's
        self.local_sizes = [tp.split(size) for size in output_sizes]  # this rank's
        super().__init__(in_features, sum(self.local_sizes), bias, dtype, device, tp)

    def shard_parts(self, shard: ShardId) -> list[int]:
        """The parts a checkpoint tensor holds: all of them (None) or part ``shard``."""
        if shard is None:
            return list(range(len(self.output_sizes)))
        if not (isinstance(shard, int) and 0 <= shard < len(self.output_sizes)):
            raise ValueError(f"{type(self).__name__} has no shard {shard!r}")
        return [shard]

    def load_weight(self, param: nn.Parameter, loaded: torch.Tensor, shard: ShardId) -> None:
        parts = self.shard_parts(shard)
        check_shape(loaded, (sum(self.output_sizes[i] for i in parts), *param.shape[1:]))
        src = 0  # where part i starts in the checkpoint tensor
        for i in parts:
            local = self.local_sizes[i]
            copy_weight(param.narrow(0, sum(self.local_sizes[:i]), local),
                        loaded.narrow(0, src + self.tp.rank * local, local))
            src += self.output_sizes[i]

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None):
        """``(self(normed), summed)`` for ``normed, summed = norm(x, residual)``: in one launch
        where the GEMV takes it (a column layer needs no collective, so any rank may)."""
        if triton_gemv.usable_rms_norm(x, residual, norm.weight, self.weight):
            y, summed = triton_gemv.gemv_rms_norm(x, residual, norm.weight, norm.eps,
                                                  norm.unit_offset, self.weight, self.bias)
            return self.outputs(y), summed
        normed, summed = norm(x, residual)
        return self(normed), summed


class QKVLinear(MergedColumnLinear):
    """The query, key and value projections as one matrix: rows [q | k | v] of this rank's
    query and KV heads."""

    SHARDS = ("q", "k", "v")

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, dtype: torch.dtype, device: torch.device, tp: TPShard = SINGLE):
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim,
                                       num_kv_heads * head_dim], bias, dtype, device, tp)
        self.q_size, self.kv_size = self.local_sizes[0], self.local_sizes[1]

    def shard_parts(self, shard: ShardId) -> list[int]:
        if shard is not None and shard not in self.SHARDS:
            raise ValueError(f"QKVLinear has no shard {shard!r}")
        return super().shard_parts(None if shard is None else self.SHARDS.index(shard))

    def outputs(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """y: [T, (Hq + 2 Hkv) D] -> q [T, Hq*D], k [T, Hkv*D], v [T, Hkv*D] (this rank's heads;
        views of y)."""
        return y.split([self.q_size, self.kv_size, self.kv_size], dim=-1)


class RowLinear(Linear):
    """Input features split across the ranks (rank r: columns ``r * in / tp ..``); the partial
    products are summed over the ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device, tp: TPShard = SINGLE):
        super().__init__(tp.split(in_features), out_features, bias, dtype, device, tp)

    def load_weight(self, param: nn.Parameter, loaded: torch.Tensor, shard: ShardId) -> None:
        if shard is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard!r}")
        if param is self.bias:  # added once, after the sum
            copy_weight(param, loaded)
            return
        check_shape(loaded, (self.out_features, self.in_features * self.tp.size))
        copy_weight(param, loaded.narrow(1, self.tp.rank * self.in_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, I / tp] (this rank's features) -> [T, O], summed over the ranks."""
        return self.reduce(linear(x, self.weight, self.local_bias))

    def forward_gated(self, gate_up: torch.Tensor, hidden_act: str) -> torch.Tensor:
        """``self(act(gate) * up)`` for gate_up = [gate | up] ([T, 2 I / tp]) and the gated
        activation named in ``GATED_ACTIVATIONS``: SiLU's in one launch where the GEMV takes
        it."""
        if hidden_act == "silu" and triton_gemv.usable_silu_mul(gate_up, self.weight):
            return self.reduce(triton_gemv.gemv_silu_mul(gate_up, self.weight, self.local_bias))
        return self(GATED_ACTIVATIONS[hidden_act](gate_up))

    @property
    def local_bias(self) -> torch.Tensor | None:
        """The bias this rank's product adds itself: all of it with one rank, else none (it is
        added once, after the sum)."""
        return self.bias if self.tp.size == 1 else None

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """This rank's product ([T, O]) summed over the ranks plus the bias (with one rank, the
        product itself: it holds the bias already)."""
        if self.tp.size == 1:
            return partial
        y = self.tp.all_reduce(partial)
        return y if self.bias is None else y + self.bias


def project_then_norm(row: RowLinear, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm,
                      column: MergedColumnLinear):
    """``(column(normed), summed)`` for ``normed, summed = norm(row(x), residual)``: a
    sub-layer's output projection, the residual add and norm after it, and the next
    projection. With one rank and one row, two launches where there were three: the row GEMV
    adds the residual and sums the squares of its features, and the column GEMV normalizes
    its input from those sums."""
    if (row.tp.size == 1 and triton_gemv.usable_add_sumsq(x, residual, row.weight)
            and triton_gemv.usable_norm_sumsq(residual, norm.weight, column.weight)):
        summed, sumsq = triton_gemv.gemv_add_sumsq(x, residual, row.weight, row.bias)
        y = triton_gemv.gemv_norm_sumsq(summed, sumsq, norm.weight, norm.eps, norm.unit_offset,
                                        column.weight, column.bias)
        return column.outputs(y), summed
    normed, summed = norm(row(x), residual)
    return column(normed), summed
