"""Builds the sampler's per-step input (``SamplingBatch``) from the scheduled sequences.

The step's small vectors (temperatures, top-k, seeds, penalty values, token entries, ...) are
gathered on the host in one pass over the rows and reach the device in one transfer per dtype
(``StepPacker``: a pinned buffer, so the copy does not wait for the work queued before it).
Per-request state that lives across steps (counts of generated tokens, tokens seen in prompt or
output) stays on the device in ``PenaltyRows``, updated from the sequences' accepted tokens and,
under asynchronous scheduling, from the ids the step before sampled, read on the device. Features
no row uses are left out of the batch.

A step's sequences may have a pending token (``Sequence.num_pending_tokens``): the one the step
samples, and under asynchronous scheduling the one the step before sampled, not on the host yet.
What depends on the number of tokens generated (seeded draws, min_tokens) counts it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from hifc.core.sequence import Sequence
from hifc.layers.sampler import Penalties, SamplingBatch, TokenEntries
from hifc.layers.sampling_ops import seeded_uniform
from hifc.runtime.inputs import to_device
from hifc.runtime.step_result import DeviceTokens


@dataclass
class StepConstraints:
    """Token constraints the engine computes for a step (row = index in the scheduled list):
    tokens banned by bad words, and grammar bitmasks ([G, ceil(V/32)] int32, host memory)."""

    banned_rows: list[int] = field(default_factory=list)
    banned_tokens: list[int] = field(default_factory=list)
    grammar_rows: list[int] = field(default_factory=list)
    grammar_bitmask: torch.Tensor | None = None


ALIGN_BYTES = 16


class StepPacker:
    """Moves a step's named host vectors to the device, one transfer per dtype (and host
    arrays, such as grammar bitmasks, one transfer each).

    On CUDA the values go through pinned host buffers, used in turn (``depth`` sets): a step
    packs into the set whose copies ended with the step before the one in flight, so packing
    never waits for the device while it runs that step (asynchronous scheduling)."""

    _DTYPES = {torch.int64: np.int64, torch.float32: np.float32}

    def __init__(self, device: torch.device, depth: int = 3):
        self.device = device
        self._pinned = device.type == "cuda"
        # each set's pinned buffers: one per dtype of vectors, one per named array
        self._sets: list[dict[torch.dtype | str, torch.Tensor]] = [{} for _ in range(depth)]
        # when each set's last copies have read it (recorded on the stream after them)
        self._copied = [torch.cuda.Event() for _ in range(depth)] if self._pinned else []
        self._turn = 0

    def pack(self, ints: dict[str, list[int]], floats: dict[str, list[float]],
             arrays: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Device tensors (int64 / float32) named as the lists given, and device copies of the
        host tensors ``arrays`` (int32, any shape)."""
        turn = self._turn
        self._turn = (turn + 1) % len(self._sets)
        if self._pinned:
            self._copied[turn].synchronize()  # that set's copies (steps ago) have read it
        tensors = {}
        for dtype, parts in ((torch.int64, ints), (torch.float32, floats)):
            # each vector starts 16-byte aligned: Triton compiles a kernel anew for a pointer
            # argument whose alignment differs from its earlier calls
            align = ALIGN_BYTES // dtype.itemsize
            spans, padded, total = [], [], 0
            for name, values in parts.items():
                spans.append((name, total, len(values)))
                pad = -len(values) % align
                padded.append(itertools.chain(values, itertools.repeat(0, pad)))
                total += len(values) + pad
            if not total:
                continue
            flat = self._transfer(self._sets[turn], dtype,
                                  itertools.chain.from_iterable(padded), total)
            for name, start, length in spans:
                tensors[name] = flat[start:start + length]
        for name, array in (arrays or {}).items():
            tensors[name] = self._transfer_array(self._sets[turn], name, array)
        if self._pinned:
            self._copied[turn].record()
        return tensors

    def _transfer_array(self, buffers: dict, name: str, array: torch.Tensor) -> torch.Tensor:
        if not self._pinned:
            return array.to(self.device)
        staged = _pinned_buffer(buffers, name, array.numel(), array.dtype)[:array.numel()]
        staged = staged.view(array.shape)
        staged.copy_(array)
        return staged.to(self.device, non_blocking=True)

    def _transfer(self, buffers: dict[torch.dtype, torch.Tensor], dtype: torch.dtype, values,
                  total: int) -> torch.Tensor:
        if not self._pinned:
            return torch.tensor(list(values), dtype=dtype, device=self.device)
        host = _pinned_buffer(buffers, dtype, total, dtype)
        host.numpy()[:total] = np.fromiter(values, self._DTYPES[dtype], count=total)
        return host[:total].to(self.device, non_blocking=True)


def _pinned_buffer(buffers: dict, key, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """``buffers[key]``, a pinned host buffer of ``dtype`` with room for ``numel`` values (made
    or grown, at least doubling, when it has not)."""
    host = buffers.get(key)
    if host is None or host.numel() < numel or host.dtype != dtype:
        size = max(numel, 1024, 2 * (0 if host is None else host.numel()))
        host = buffers[key] = torch.empty(size, dtype=dtype, pin_memory=True)
    return host


@dataclass
class PenaltyPlan:
    """A step's penalty rows (``rows``: the pool row of each penalized sequence) and the tokens
    to count before it: (row, token) pairs known on the host, and the pool rows of the tokens
    the step before sampled, for the sequences ``pending_ids``, read on the device."""

    rows: list[int] = field(default_factory=list)
    new_rows: list[int] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    pending_rows: list[int] = field(default_factory=list)
    pending_ids: list[str] = field(default_factory=list)


@dataclass
class _PenaltySlot:
    seq: Sequence  # the request this slot counts for (a reused request id gets a new slot)
    row: int
    num_counted: int = 0  # generated tokens already added to the counts


class PenaltyRows:
    """Device rows of penalty state, one per request with penalties: counts [N, V] float32 of
    its generated tokens and seen [N, V] bool of the tokens in its prompt or output. A row is
    taken when a request is first scheduled, updated each step from the tokens it accepted
    since, and released when it finishes; the pool doubles when full."""

    def __init__(self, vocab_size: int, device: torch.device, initial_rows: int = 8):
        self.vocab_size = vocab_size
        self.device = device
        self.counts = torch.zeros(initial_rows, vocab_size, dtype=torch.float32, device=device)
        self.seen = torch.zeros(initial_rows, vocab_size, dtype=torch.bool, device=device)
        self._slots: dict[str, _PenaltySlot] = {}
        self._ones = torch.ones(256, device=device)  # the increments of update()
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

    def plan(self, seqs: list[Sequence]) -> PenaltyPlan:
        """The pool rows of these sequences (scheduled in the step being launched), and the
        tokens they generated since the last step (for :meth:`update`)."""
        plan = PenaltyPlan()
        for seq in seqs:
            slot = self._slots.get(seq.request_id)
            if slot is None or slot.seq is not seq:
                slot = self._take(seq)
            out = seq.output_token_ids
            if len(out) > slot.num_counted:
                fresh = out[slot.num_counted:]
                plan.new_rows.extend([slot.row] * len(fresh))
                plan.new_tokens.extend(fresh)
            generated = seq.num_generated_before_sample
            if generated > max(len(out), slot.num_counted):  # the step before's token
                plan.pending_rows.append(slot.row)
                plan.pending_ids.append(seq.request_id)
            slot.num_counted = max(slot.num_counted, generated)
            plan.rows.append(slot.row)
        return plan

    def update(self, new_rows: torch.Tensor, new_tokens: torch.Tensor) -> None:
        """Count the planned new tokens ([N] long each): one atomic add and one store over the
        flattened pool (small integer counts add exactly, in any order)."""
        flat = new_rows * self.vocab_size + new_tokens  # [N]
        if self._ones.shape[0] < flat.shape[0]:
            self._ones = torch.ones(2 * flat.shape[0], device=self.device)
        self.counts.view(-1).index_add_(0, flat, self._ones[:flat.shape[0]])
        self.seen.view(-1).index_fill_(0, flat, True)  # a scalar: no host copy, no sync

    def _take(self, seq: Sequence) -> _PenaltySlot:
        old = self._slots.pop(seq.request_id, None)
        if old is not None:  # the id now names another request
            self._free_rows.append(old.row)
        if not self._free_rows:
            self._grow()
        row = self._free_rows.pop()
        self.counts[row].zero_()
        self.seen[row].zero_()
        prompt = to_device(seq.prompt_token_ids, torch.long, self.device)
        self.seen[row].index_fill_(0, prompt, True)
        slot = self._slots[seq.request_id] = _PenaltySlot(seq, row)
        return slot

    def _grow(self) -> None:
        n = self.num_rows
        self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
        self.seen = torch.cat([self.seen, torch.zeros_like(self.seen)])
        self._free_rows.extend(range(2 * n - 1, n - 1, -1))


def build_sampling_batch(seqs: list[Sequence], constraints: StepConstraints | None,
                         penalty_rows: PenaltyRows | None, packer: StepPacker,
                         vocab_size: int, previous: DeviceTokens | None = None) -> SamplingBatch:
    """The sampler's input for one step over ``seqs`` (the scheduled order); ``previous``: the
    ids the step launched before sampled (the pending tokens of the penalized sequences)."""
    params = [s.sampling_params for s in seqs]
    if constraints is None and all(p.plain_greedy for p in params):
        return SamplingBatch(temperature=None, greedy=None, all_greedy=True)  # argmax alone
    greedy = [p.greedy for p in params]
    ints: dict[str, list[int]] = {}
    floats: dict[str, list[float]] = {
        "temperature": [1.0 if g else p.temperature for p, g in zip(params, greedy)]}
    all_greedy = all(greedy)
    if any(greedy) and not all_greedy:
        ints["greedy"] = greedy
    if not all_greedy:
        _truncation(params, greedy, vocab_size, ints, floats)
        _seeds(seqs, params, greedy, ints, floats)
    penalized = [i for i, p in enumerate(params) if p.has_penalties]
    if penalized:
        _penalties(seqs, params, penalized, penalty_rows, previous, ints, floats)
    _token_entries(seqs, params, constraints, ints, floats)
    grammars = constraints is not None and constraints.grammar_rows
    t = packer.pack(ints, floats,
                    {"grammar_bitmask": constraints.grammar_bitmask} if grammars else None)
    batch = SamplingBatch(
        temperature=t["temperature"], greedy=t["greedy"].bool() if "greedy" in t else None,
        all_greedy=all_greedy, top_k=t.get("top_k"), top_p=t.get("top_p"),
        min_p=t.get("min_p"), seeded_rows=t.get("seeded_rows"),
        seeded_uniform=t.get("seeded_uniform"))
    if penalized:
        _count_new_tokens(t, penalty_rows, previous)
        batch.penalties = Penalties(
            rows=None if len(penalized) == len(seqs) else t["penalty_rows"],
            pool_rows=t["pool_rows"], counts=penalty_rows.counts, seen=penalty_rows.seen,
            presence=t["presence"], frequency=t["frequency"], repetition=t["repetition"])
    if "bias_rows" in t:
        batch.bias = TokenEntries(t["bias_rows"], t["bias_tokens"], t["bias_values"])
    if "allowed_rows" in t:
        batch.allowed_rows = t["allowed_rows"]
        batch.allowed = TokenEntries(t["allowed_entry_rows"], t["allowed_tokens"])
    if "banned_rows" in t:
        batch.banned = TokenEntries(t["banned_rows"], t["banned_tokens"])
    if "grammar_rows" in t:
        batch.grammar_rows = t["grammar_rows"]
        batch.grammar_bitmask = t["grammar_bitmask"]
    k = [p.logprobs for p in params if p.logprobs is not None]
    batch.logprobs_k = max(k) if k else None
    return batch


def _count_new_tokens(t: dict[str, torch.Tensor], penalty_rows: PenaltyRows,
                      previous: DeviceTokens | None) -> None:
    """Count the planned tokens: those known on the host, then the step before's pending ones
    (gathered from its sampled ids on the device)."""
    rows, tokens = [], []
    if "new_rows" in t:
        rows.append(t["new_rows"])
        tokens.append(t["new_tokens"])
    if "pending_rows" in t:
        rows.append(t["pending_rows"])
        tokens.append(previous.token_ids.index_select(0, t["pending_sources"]))
    if rows:
        penalty_rows.update(torch.cat(rows), torch.cat(tokens))


def _truncation(params, greedy, vocab_size: int, ints: dict, floats: dict) -> None:
    """top-k, top-p and min-p of the sampled rows (neutral values elsewhere)."""
    top_k = [p.top_k if 0 < p.top_k < vocab_size and not g else vocab_size
             for p, g in zip(params, greedy)]
    top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy)]
    min_p = [0.0 if g else p.min_p for p, g in zip(params, greedy)]
    if any(k < vocab_size for k in top_k):
        ints["top_k"] = top_k
    if any(p < 1.0 for p in top_p):
        floats["top_p"] = top_p
    if any(m > 0.0 for m in min_p):
        floats["min_p"] = min_p


def _seeds(seqs, params, greedy, ints: dict, floats: dict) -> None:
    """The seeded sampled rows and their uniform numbers (from seed and step, on the host)."""
    rows = [i for i, (p, g) in enumerate(zip(params, greedy)) if p.seed is not None and not g]
    if rows:
        ints["seeded_rows"] = rows
        floats["seeded_uniform"] = seeded_uniform(
            [params[i].seed for i in rows], [seqs[i].num_generated_before_sample for i in rows])


def _penalties(seqs, params, rows: list[int], penalty_rows: PenaltyRows,
               previous: DeviceTokens | None, ints: dict, floats: dict) -> None:
    plan = penalty_rows.plan([seqs[i] for i in rows])
    ints["pool_rows"] = plan.rows
    if len(rows) < len(seqs):
        ints["penalty_rows"] = rows
    if plan.new_rows:
        ints["new_rows"], ints["new_tokens"] = plan.new_rows, plan.new_tokens
    if plan.pending_rows:
        ints["pending_rows"] = plan.pending_rows
        ints["pending_sources"] = [previous.rows[rid] for rid in plan.pending_ids]
    floats["presence"] = [params[i].presence_penalty for i in rows]
    floats["frequency"] = [params[i].frequency_penalty for i in rows]
    floats["repetition"] = [params[i].repetition_penalty for i in rows]


def _token_entries(seqs, params, constraints: StepConstraints | None, ints: dict,
                   floats: dict) -> None:
    """Logit bias, allowed tokens, bans (bad words; stop tokens before min_tokens) and the rows
    of grammar bitmasks."""
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
        if p.min_tokens and seq.num_generated_before_sample < p.min_tokens:
            stops = seq.stop_token_ids_before_min_tokens()
            banned_rows.extend([i] * len(stops))
            banned_tokens.extend(stops)
    if bias_rows:
        ints["bias_rows"], ints["bias_tokens"] = bias_rows, bias_tokens
        floats["bias_values"] = bias_values
    if allowed_rows:
        ints["allowed_rows"] = allowed_rows
        ints["allowed_entry_rows"], ints["allowed_tokens"] = entry_rows, entry_tokens
    if banned_rows:
        ints["banned_rows"], ints["banned_tokens"] = banned_rows, banned_tokens
    if constraints is not None and constraints.grammar_rows:
        ints["grammar_rows"] = constraints.grammar_rows
