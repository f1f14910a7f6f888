"""Token sampling for a whole step at once: masks, penalties, temperature, min-p, top-k/top-p,
seeded or unseeded draws, and log-probabilities, as batched tensor operations.

Order (vLLM's): raw log-probabilities (if any row asks) -> grammar bitmask, allowed tokens,
banned tokens, logit bias -> penalties -> greedy argmax | temperature -> min-p -> top-k/top-p ->
draw. Greedy rows take the argmax of the processed logits, so penalties and masks apply to them
too.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hifc.layers import sampling_ops as ops


@dataclass
class Penalties:
    """Rows with penalties and their state: rows [R] long (None: every row, in order); row r's
    state is row pool_rows[r] of the penalty pool's counts [N, V] float32 (generated tokens) and
    seen [N, V] bool (in the prompt or the output); presence, frequency, repetition [R]
    float32."""

    rows: torch.Tensor | None
    pool_rows: torch.Tensor
    counts: torch.Tensor
    seen: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor


@dataclass
class TokenEntries:
    """Sparse (row, token) entries of a step: rows [N] long, tokens [N] long, values [N]
    float32 (a logit bias) or None (a ban)."""

    rows: torch.Tensor
    tokens: torch.Tensor
    values: torch.Tensor | None = None


@dataclass
class SamplingBatch:
    """Everything the sampler needs for one step, as device tensors over its B rows. Features no
    row uses are None (and cost nothing)."""

    temperature: torch.Tensor | None  # [B] float32, 1.0 on greedy rows; None: all plain greedy
    greedy: torch.Tensor | None  # [B] bool; None: no row is greedy
    all_greedy: bool
    top_k: torch.Tensor | None = None  # [B] long; V where off
    top_p: torch.Tensor | None = None  # [B] float32; 1.0 where off
    min_p: torch.Tensor | None = None  # [B] float32; 0.0 where off
    seeded_rows: torch.Tensor | None = None  # [S] long
    seeded_uniform: torch.Tensor | None = None  # [S] float32: their draws' uniform numbers
    penalties: Penalties | None = None
    bias: TokenEntries | None = None
    banned: TokenEntries | None = None
    allowed_rows: torch.Tensor | None = None  # [A] long
    allowed: TokenEntries | None = None  # rows index allowed_rows
    grammar_rows: torch.Tensor | None = None  # [G] long
    grammar_bitmask: torch.Tensor | None = None  # [G, ceil(V/32)] int32
    logprobs_k: int | None = None  # largest top-k any row asked for; None: none asked


@dataclass
class SampledTokens:
    """token_ids [B] long; with logprobs: the sampled tokens' raw logprobs [B] and ranks [B],
    the top-k ids and logprobs [B, k]."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    ranks: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


class Sampler:
    def sample(self, logits: torch.Tensor, batch: SamplingBatch,
               generator: torch.Generator) -> SampledTokens:
        """logits [B, V] (the model's dtype) -> one token per row. ``generator`` draws the
        uniform numbers of unseeded rows. A step of greedy rows that nothing else edits takes
        the argmax of the logits as they come (float32 orders 16-bit values alike); any other
        converts them to float32 first.
        The logits are edited in place (they are the step's own: nothing reads them after)."""
        edits = _edits(batch)
        if batch.all_greedy and batch.logprobs_k is None and not edits:
            return SampledTokens(ops.argmax(logits))
        logits = logits.to(torch.float32)
        raw_logprobs = (torch.log_softmax(logits, dim=-1) if batch.logprobs_k is not None
                        else None)  # [B, V]
        for edit in edits:
            edit(logits)
        if batch.all_greedy:
            token_ids = ops.argmax(logits)  # [B]
        elif batch.greedy is None:
            token_ids = _draw(logits, batch, generator)
        else:
            token_ids = torch.where(batch.greedy, ops.argmax(logits),
                                    _draw(logits, batch, generator))
        if raw_logprobs is None:
            return SampledTokens(token_ids)
        chosen, ranks, top_ids, top_lp = ops.top_logprobs(raw_logprobs, token_ids,
                                                          batch.logprobs_k)
        return SampledTokens(token_ids, chosen, ranks, top_ids, top_lp)

    @staticmethod
    def warm_up(logits: torch.Tensor) -> None:
        """Run each device pass a step's sampling may take (the greedy argmax of the logits as
        they come and in float32; the penalties over every row and over listed rows; a grammar
        bitmask) on ``logits`` ([B, V], a warm-up step's own), so that those that compile do
        so now."""
        ops.argmax(logits)
        logits = logits.to(torch.float32)
        ops.argmax(logits)
        vocab, device = logits.shape[1], logits.device
        counts = torch.zeros(1, vocab, dtype=torch.float32, device=device)
        seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
        first = torch.zeros(1, dtype=torch.long, device=device)
        ones = torch.ones(1, dtype=torch.float32, device=device)
        for rows in (None, first):
            ops.apply_penalties(logits[:1], rows, first, counts, seen, ones, ones, ones)
        allow_all = torch.full((1, -(-vocab // 32)), -1, dtype=torch.int32, device=device)
        ops.apply_token_bitmask(logits, first, allow_all)

    @staticmethod
    def process(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The logits ([B, V], float32: edited in place) after the masks, the logit bias and
        the penalties: greedy rows take their argmax, sampled rows draw from them after
        temperature, min-p, top-k and top-p."""
        for edit in _edits(batch):
            edit(logits)
        return logits


def _edits(batch: SamplingBatch) -> list[Callable[[torch.Tensor], None]]:
    """The batch's in-place edits of float32 logits, in order: the grammar bitmask, the allowed
    and banned tokens, the logit bias, the penalties (none: the logits stay as they come)."""
    edits = []
    if batch.grammar_bitmask is not None:
        edits.append(lambda x: ops.apply_token_bitmask(x, batch.grammar_rows,
                                                       batch.grammar_bitmask))
    if batch.allowed is not None:
        edits.append(lambda x: ops.keep_only(x, batch.allowed_rows, batch.allowed.rows,
                                             batch.allowed.tokens))
    if batch.banned is not None:
        # a device value: ``logits[rows, tokens] = -inf`` copies a host scalar, a sync on CUDA
        edits.append(lambda x: x.index_put_((batch.banned.rows, batch.banned.tokens),
                                            x.new_full((1,), float("-inf"))))
    if batch.bias is not None:
        edits.append(lambda x: x.index_put_((batch.bias.rows, batch.bias.tokens),
                                            batch.bias.values, accumulate=True))
    if batch.penalties is not None:
        p = batch.penalties
        edits.append(lambda x: ops.apply_penalties(x, p.rows, p.pool_rows, p.counts, p.seen,
                                                   p.presence, p.frequency, p.repetition))
    return edits


def _draw(logits: torch.Tensor, batch: SamplingBatch,
          generator: torch.Generator) -> torch.Tensor:
    """Random draws [B] after temperature, min-p, top-k and top-p (vLLM's order)."""
    logits = logits / batch.temperature[:, None]
    if batch.top_k is not None or batch.top_p is not None:
        if batch.min_p is not None:
            ops.apply_min_p(logits, batch.min_p)
        probs = torch.softmax(ops.apply_top_k_top_p(logits, batch.top_k, batch.top_p), dim=-1)
    else:
        probs = torch.softmax(logits, dim=-1)  # [B, V]
        if batch.min_p is not None:  # the same cut, without a second softmax
            ops.apply_min_p_to_probs(probs, batch.min_p)
    num_rows = probs.shape[0]
    if batch.seeded_rows is not None and batch.seeded_rows.shape[0] == num_rows:
        uniform = batch.seeded_uniform  # every row seeded, in order
    else:
        uniform = torch.rand(num_rows, device=probs.device, generator=generator)
        if batch.seeded_rows is not None:
            uniform.index_copy_(0, batch.seeded_rows, batch.seeded_uniform)
    return ops.sample_inverse_cdf(probs, uniform)
