"""Builds the sampler's per-step input (``SamplingBatch``) from the scheduled sequences.

Per-request state that lives across steps (penalty counts of generated tokens, prompt-token
masks) stays on the device in ``PenaltyRows``, updated from the sequences' accepted tokens at
each step; everything else is packed from the sequences' parameters in one pass over the rows,
and features no row uses are left out of the batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hifc.core.sequence import Sequence
from hifc.layers.sampler import Penalties, SamplingBatch, TokenEntries


@dataclass
class StepConstraints:
    """Token constraints the engine computes for a step (row = index in the scheduled list):
    tokens banned by bad words, and grammar bitmasks ([G, ceil(V/32)] int32, host memory)."""

    banned_rows: list[int] = field(default_factory=list)
    banned_tokens: list[int] = field(default_factory=list)
    grammar_rows: list[int] = field(default_factory=list)
    grammar_bitmask: torch.Tensor | None = None


@dataclass
class _PenaltySlot:
    seq: Sequence  # the request this slot counts for (a reused request id gets a new slot)
    row: int
    num_counted: int = 0  # generated tokens already added to the counts


class PenaltyRows:
    """Device rows of penalty state, one per request with penalties: counts [N, V] int32 of its
    generated tokens and prompt_mask [N, V] bool of its prompt tokens. Rows are taken when a
    request is first scheduled, updated each step from the tokens it accepted since, and
    released when it finishes; the pool doubles when full."""

    def __init__(self, vocab_size: int, device: torch.device, initial_rows: int = 8):
        self.vocab_size = vocab_size
        self.device = device
        self.counts = torch.zeros(initial_rows, vocab_size, dtype=torch.int32, device=device)
        self.prompt_mask = torch.zeros(initial_rows, vocab_size, dtype=torch.bool, device=device)
        self._slots: dict[str, _PenaltySlot] = {}
        self._free_rows = list(range(initial_rows - 1, -1, -1))

    @property
    def num_rows(self) -> int:
        return self.counts.shape[0]

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            slot = self._slots.get(request_id)
            if slot is not None and slot.seq.status.is_finished:
                del self._slots[request_id]
                self._free_rows.append(slot.row)

    def rows_for(self, seqs: list[Sequence]) -> torch.Tensor:
        """The pool rows ([R] long) of these sequences, brought up to date with their tokens."""
        rows, new_rows, new_tokens = [], [], []
        for seq in seqs:
            slot = self._slots.get(seq.request_id)
            if slot is None or slot.seq is not seq:
                slot = self._take(seq)
            out = seq.output_token_ids
            if len(out) > slot.num_counted:
                fresh = out[slot.num_counted:]
                new_rows.extend([slot.row] * len(fresh))
                new_tokens.extend(fresh)
                slot.num_counted = len(out)
            rows.append(slot.row)
        if new_rows:
            index = (torch.tensor(new_rows, device=self.device),
                     torch.tensor(new_tokens, device=self.device))
            self.counts.index_put_(index, torch.ones(len(new_rows), dtype=torch.int32,
                                                     device=self.device), accumulate=True)
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _take(self, seq: Sequence) -> _PenaltySlot:
        old = self._slots.pop(seq.request_id, None)
        if old is not None:  # the id now names another request
            self._free_rows.append(old.row)
        if not self._free_rows:
            self._grow()
        row = self._free_rows.pop()
        self.counts[row].zero_()
        self.prompt_mask[row].zero_()
        prompt = torch.tensor(seq.prompt_token_ids, dtype=torch.long, device=self.device)
        self.prompt_mask[row].index_fill_(0, prompt, True)
        slot = self._slots[seq.request_id] = _PenaltySlot(seq, row)
        return slot

    def _grow(self) -> None:
        n = self.num_rows
        self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
        self.prompt_mask = torch.cat([self.prompt_mask, torch.zeros_like(self.prompt_mask)])
        self._free_rows.extend(range(2 * n - 1, n - 1, -1))


def build_sampling_batch(seqs: list[Sequence], constraints: StepConstraints | None,
                         penalty_rows: PenaltyRows, vocab_size: int,
                         device: torch.device) -> SamplingBatch:
    """The sampler's input for one step over ``seqs`` (the scheduled order)."""
    params = [s.sampling_params for s in seqs]
    greedy = [p.greedy for p in params]
    batch = SamplingBatch(
        temperature=_floats([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                            device),
        greedy=(torch.tensor(greedy, device=device) if any(greedy) and not all(greedy)
                else None),
        all_greedy=all(greedy))
    if not batch.all_greedy:
        _add_truncation(batch, params, greedy, vocab_size, device)
        _add_seeds(batch, seqs, params, greedy, device)
    _add_penalties(batch, seqs, params, penalty_rows, device)
    _add_token_entries(batch, seqs, params, constraints, device)
    k = [p.logprobs for p in params if p.logprobs is not None]
    batch.logprobs_k = max(k) if k else None
    return batch


def _floats(values: list[float], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def _longs(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _add_truncation(batch: SamplingBatch, params, greedy, vocab_size: int, device) -> None:
    """top-k, top-p and min-p of the sampled rows (neutral values elsewhere)."""
    top_k = [p.top_k if 0 < p.top_k < vocab_size and not g else vocab_size
             for p, g in zip(params, greedy)]
    top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy)]
    min_p = [0.0 if g else p.min_p for p, g in zip(params, greedy)]
    if any(k < vocab_size for k in top_k):
        batch.top_k = _longs(top_k, device)
    if any(p < 1.0 for p in top_p):
        batch.top_p = _floats(top_p, device)
    if any(m > 0.0 for m in min_p):
        batch.min_p = _floats(min_p, device)


def _add_seeds(batch: SamplingBatch, seqs, params, greedy, device) -> None:
    rows = [i for i, (p, g) in enumerate(zip(params, greedy)) if p.seed is not None and not g]
    if rows:
        batch.seeded_rows = _longs(rows, device)
        batch.seeds = _longs([params[i].seed for i in rows], device)
        batch.steps = _longs([len(seqs[i].output_token_ids) for i in rows], device)


def _add_penalties(batch: SamplingBatch, seqs, params, penalty_rows: PenaltyRows,
                   device) -> None:
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return
    pool_rows = penalty_rows.rows_for([seqs[i] for i in rows])
    batch.penalties = Penalties(
        rows=_longs(rows, device),
        counts=penalty_rows.counts.index_select(0, pool_rows),
        prompt_mask=penalty_rows.prompt_mask.index_select(0, pool_rows),
        presence=_floats([params[i].presence_penalty for i in rows], device),
        frequency=_floats([params[i].frequency_penalty for i in rows], device),
        repetition=_floats([params[i].repetition_penalty for i in rows], device))


def _add_token_entries(batch: SamplingBatch, seqs, params, constraints: StepConstraints | None,
                       device) -> None:
    """Logit bias, allowed tokens, bans (bad words; stop tokens before min_tokens) and grammar
    bitmasks."""
    bias_rows, bias_tokens, bias_values = [], [], []
    allowed_rows, entry_rows, entry_tokens = [], [], []
    banned_rows = list(constraints.banned_rows) if constraints else []
    banned_tokens = list(constraints.banned_tokens) if constraints else []
    for i, (seq, p) in enumerate(zip(seqs, params)):
        if p.logit_bias:
            bias_rows.extend([i] * len(p.logit_bias))
            bias_tokens.extend(p.logit_bias)
            bias_values.extend(p.logit_bias.values())
        if p.allowed_token_ids:
            entry_rows.extend([len(allowed_rows)] * len(p.allowed_token_ids))
            entry_tokens.extend(p.allowed_token_ids)
            allowed_rows.append(i)
        if p.min_tokens and len(seq.output_token_ids) < p.min_tokens:
            stops = seq.stop_token_ids_before_min_tokens()
            banned_rows.extend([i] * len(stops))
            banned_tokens.extend(stops)
    if bias_rows:
        batch.bias = TokenEntries(_longs(bias_rows, device), _longs(bias_tokens, device),
                                  _floats(bias_values, device))
    if allowed_rows:
        batch.allowed_rows = _longs(allowed_rows, device)
        batch.allowed = TokenEntries(_longs(entry_rows, device), _longs(entry_tokens, device))
    if banned_rows:
        batch.banned = TokenEntries(_longs(banned_rows, device), _longs(banned_tokens, device))
    if constraints is not None and constraints.grammar_rows:
        batch.grammar_rows = _longs(constraints.grammar_rows, device)
        batch.grammar_bitmask = constraints.grammar_bitmask.to(device, non_blocking=True)
