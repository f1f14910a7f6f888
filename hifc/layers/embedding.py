"""The token embedding and the LM head, split over the vocabulary across tensor-parallel ranks.

The vocabulary is padded to a multiple of the ranks and cut into equal ranges: rank r holds rows
``r * V_r .. (r + 1) * V_r`` (padding rows are zeros). The embedding looks up the ids in its
range (others give zeros) and sums over the ranks; the LM head computes the logits of its range
and gathers them along the vocabulary (every rank gets all of them; only the engine's rank
samples), then drops the padding. A tied model computes its logits with the embedding's rows.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hifc.layers.linear import ShardId, check_shape, copy_weight
from hifc.layers.tensor_parallel import SINGLE, TPShard


class VocabParallelEmbedding(nn.Module):
    """A [vocab, hidden] table of which this rank holds its vocabulary range; serves as the
    embedding (``forward``) and as the LM head (``logits``)."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, tp: TPShard = SINGLE):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp = tp
        self.rows = -(-vocab_size // tp.size)  # per rank, the vocabulary padded
        self.first = tp.rank * self.rows
        self.num_real = max(0, min(self.rows, vocab_size - self.first))  # rows not padding
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size, dtype=dtype,
                                               device=device), requires_grad=False)  # [V_r, H]
        if self.num_real < self.rows:
            with torch.no_grad():
                self.weight[self.num_real:].zero_()

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, rows={self.first}..{self.first + self.rows}, "
                f"hidden={self.weight.shape[1]}")

    def load_weight(self, param: nn.Parameter, loaded: torch.Tensor, shard: ShardId) -> None:
        """This rank's rows of the checkpoint's [vocab, hidden] table."""
        if shard is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard!r}")
        check_shape(loaded, (self.vocab_size, param.shape[1]))
        copy_weight(param.narrow(0, 0, self.num_real), loaded.narrow(0, self.first, self.num_real))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> embeddings [T, H], summed over the ranks."""
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.first
        outside = (local < 0) | (local >= self.rows)  # [T]
        out = F.embedding(local.masked_fill(outside, 0), self.weight)  # [T, H]
        return self.tp.all_reduce(out.masked_fill_(outside[:, None], 0))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, vocab] in the weights' dtype over the whole vocabulary,
        on every rank."""
        local = F.linear(hidden, self.weight)  # [N, V_r]
        logits = self.tp.gather_columns(local)  # [N, tp * V_r]
        return logits if logits.shape[1] == self.vocab_size else \
            logits[:, :self.vocab_size].contiguous()
