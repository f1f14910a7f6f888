"""Runs one scheduled step on the device: inputs -> model -> logits -> sampled tokens.

With tensor parallelism the engine's runner (rank 0) announces each step to the other ranks'
runners (``followers``) before computing it; they run the same forward pass and logits
(``follow``: the model's collectives pair up) and sample nothing."""
from __future__ import annotations

import logging
from typing import Protocol

import torch

from hifc.core.outputs import PromptLogprobs, SamplerOutput, TopLogprobs
from hifc.core.scheduler import ScheduledSeq, SchedulerOutput
from hifc.core.sequence import Sequence
from hifc.layers import sampling_ops
from hifc.layers.attention import AttentionBackend, AttentionContext
from hifc.layers.sampler import SampledTokens, Sampler
from hifc.runtime import inputs
from hifc.runtime.cuda_graphs import DecodeGraphs, capture_sizes, graphs_unsupported_reason
from hifc.runtime.sampling_inputs import (PenaltyRows, StepConstraints, StepPacker,
                                          build_sampling_batch)

logger = logging.getLogger(__name__)


class StepFollowers(Protocol):
    """The other tensor-parallel ranks' runners, as rank 0 drives them."""

    def announce(self, scheduled: list[ScheduledSeq],
                 logprob_spans: list[tuple[int, int, int]]) -> None:
        """Send them a step: they ``follow`` it while this rank computes it."""


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: torch.Tensor, backend: AttentionBackend,
                 block_size: int, device: torch.device, seed: int,
                 kv_scales: torch.Tensor | None = None, followers: StepFollowers | None = None):
        self.model = model  # with attention_layers: each layer's LayerAttention
        self.kv_cache = kv_cache  # [L, 2, NB, BS, Hkv, D]
        self.kv_caches = list(kv_cache.unbind(0))  # per layer [2, NB, BS, Hkv, D]
        # a float8 cache's scales: per layer [2 (K, V), Hkv] float32 on the device
        self.kv_scales = list(kv_scales.unbind(0)) if kv_scales is not None else None
        self.backend = backend
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.generator = torch.Generator(device=device)  # draws of unseeded requests
        self.generator.manual_seed(seed)
        self.penalty_rows: PenaltyRows | None = None  # made at the first step that needs them
        self.step_packer = StepPacker(device)
        self.decode_graphs: DecodeGraphs | None = None
        self.num_padded_decode_steps = 0  # steps run through decode_graphs (replayed or not)
        self.followers = followers  # the other tensor-parallel ranks (None: one rank)

    def setup_padded_decode(self, max_model_len: int, max_num_seqs: int, capture: bool) -> None:
        """Run decode-only steps padded to the batch sizes of ``capture_sizes`` from persistent
        input buffers, if this device and backend allow it: replayed from CUDA graphs captured
        now (capture=True), or the same padded computation run eagerly (capture=False, which
        ``enforce_eager`` picks, so that eager and graph runs compute bit-identical logits: the
        matrix kernels' results depend on the batch size they run at). Where padding is not
        possible here, decode steps run unpadded."""
        num_slots = self.kv_cache.shape[2] * self.block_size
        reason = graphs_unsupported_reason(self.device, self.backend, num_slots)
        if reason is not None:
            logger.info("decode steps run unpadded (no CUDA graphs): %s", reason)
            return
        self.use_padded_decode(max_model_len, capture_sizes(max_num_seqs), capture=capture)

    def use_padded_decode(self, max_model_len: int, batch_sizes: list[int],
                          capture: bool) -> None:
        """Run decode-only steps of up to max(batch_sizes) sequences padded to the next size,
        from persistent input buffers: replayed from CUDA graphs captured now (capture=True,
        CUDA only) or run eagerly (capture=False: the same computation)."""
        graphs = DecodeGraphs(self.model, self.kv_caches, self.backend, self.block_size,
                              max_model_len, batch_sizes, self.device, self.kv_scales)
        if capture:
            graphs.capture()
        self.decode_graphs = graphs

    @property
    def num_graph_decode_steps(self) -> int:
        """Decode steps replayed from a CUDA graph."""
        graphs = self.decode_graphs
        return self.num_padded_decode_steps if graphs is not None and graphs.graphs else 0

    def eager_logits(self, work: list[ScheduledSeq]) -> torch.Tensor:
        """Compute the step's K/V from unpadded inputs; returns the logits ([S, V]) of the last
        new token of each sequence that samples (S may be 0: prompt chunks only)."""
        hidden, query_start_loc = self.eager_forward(work)
        return self._sampler_logits(work, hidden, query_start_loc)

    def eager_forward(self, work: list[ScheduledSeq]) -> tuple[torch.Tensor, list[int]]:
        """Hidden states ([T, H]) of every new token, and where each sequence's start ([B+1])."""
        meta = inputs.build_attention_metadata(work, self.block_size, self.device)
        ctx = AttentionContext(meta, self.kv_caches, self.backend, self.model.attention_layers,
                               self.kv_scales)
        input_ids = inputs.build_input_ids(work, self.device)
        positions = inputs.build_positions(work, self.device)
        return self.model(input_ids, positions, ctx), meta.query_start_loc_cpu

    def _sampler_logits(self, work: list[ScheduledSeq], hidden: torch.Tensor,
                        query_start_loc: list[int]) -> torch.Tensor:
        last = inputs.build_logits_indices(work, query_start_loc, self.device)
        return self.model.compute_logits(hidden.index_select(0, last))  # [S, V]

    def _padded_logits(self, work: list[ScheduledSeq]) -> torch.Tensor | None:
        """Logits ([S, V]) of the samplers of a decode-only step run padded (None: the step
        runs eagerly). A one-token prompt chunk before the last is such a row, not sampled."""
        logits = self.decode_graphs.run(work) if self.decode_graphs is not None else None
        if logits is None:
            return None
        self.num_padded_decode_steps += 1
        if all(w.samples for w in work):
            return logits  # [B, V]
        rows = [i for i, w in enumerate(work) if w.samples]
        return logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, seqs: list[Sequence],
                constraints: StepConstraints | None = None) -> SamplerOutput:
        """Compute the scheduled tokens' K/V and sample one token per sequence that finishes
        its known tokens in this step (``ScheduledSeq.samples``). ``seqs``: the scheduled
        sequences, in ``out.scheduled`` order (their parameters, prompts and accepted tokens);
        ``constraints``: the engine's bans and grammar masks, by row of ``out.sampling``."""
        if self.penalty_rows is not None:
            self.penalty_rows.release(out.finished_request_ids)
        work = out.scheduled
        if not work:
            return SamplerOutput([])
        spans = prompt_logprob_spans(work, seqs)
        if self.followers is not None:
            self.followers.announce(work, spans)
        hidden = query_start_loc = None
        logits = self._padded_logits(work)
        if logits is None:
            hidden, query_start_loc = self.eager_forward(work)
            logits = self._sampler_logits(work, hidden, query_start_loc)  # [S, V]
        sampling = [seq for w, seq in zip(work, seqs) if w.samples]
        result = (self._sample(logits, sampling, constraints) if sampling
                  else SamplerOutput([]))
        if hidden is not None:
            result.prompt_logprobs = self._prompt_logprobs(work, seqs, spans, hidden,
                                                           query_start_loc)
        return result

    @torch.inference_mode()
    def follow(self, work: list[ScheduledSeq], spans: list[tuple[int, int, int]]) -> None:
        """A tensor-parallel rank other than 0: compute this rank's part of a step rank 0
        announced (its K/V, and the logits rank 0 computes, which gather over the ranks)."""
        if not work:
            return
        if self._padded_logits(work) is not None:
            return
        hidden, query_start_loc = self.eager_forward(work)
        self._sampler_logits(work, hidden, query_start_loc)
        for row, first, end in spans:
            offset = query_start_loc[row] - work[row].start_pos
            self.model.compute_logits(hidden[offset + first:offset + end])

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence],
                constraints: StepConstraints | None) -> SamplerOutput:
        vocab = logits.shape[-1]
        if self.penalty_rows is None and any(s.sampling_params.has_penalties for s in seqs):
            self.penalty_rows = PenaltyRows(vocab, self.device)
        batch = build_sampling_batch(seqs, constraints, self.penalty_rows, self.step_packer,
                                     vocab)
        return _to_output(self.sampler.sample(logits, batch, self.generator))

    def _prompt_logprobs(self, work: list[ScheduledSeq], seqs: list[Sequence],
                         spans: list[tuple[int, int, int]], hidden: torch.Tensor,
                         query_start_loc: list[int]) -> dict[int, PromptLogprobs]:
        """Prompt log-probabilities of the prompt tokens this step's hidden states predict,
        for the rows that ask for them, one ``spans`` entry at a time ([chunk, V] logits)."""
        parts_by_row: dict[int, list] = {}
        for row, first, end in spans:
            seq = seqs[row]
            offset = query_start_loc[row] - work[row].start_pos
            states = hidden[offset + first:offset + end]  # [C, H]
            logprobs = torch.log_softmax(self.model.compute_logits(states), dim=-1)
            targets = torch.tensor(seq.prompt_token_ids[first + 1:end + 1], device=self.device)
            parts_by_row.setdefault(row, []).append(sampling_ops.top_logprobs(
                logprobs, targets, seq.sampling_params.prompt_logprobs))
        results = {}
        for row, parts in parts_by_row.items():
            w, seq = work[row], seqs[row]
            last = min(w.seq_len, seq.num_prompt_tokens - 1)
            chosen, ranks, top_ids, top_lp = (torch.cat(t) for t in zip(*parts))
            values = TopLogprobs(seq.prompt_token_ids[w.start_pos + 1:last + 1], chosen.tolist(),
                                 ranks.tolist(), top_ids.tolist(), top_lp.tolist())
            results[row] = PromptLogprobs(w.start_pos + 1, values)
        return results


def prompt_logprob_spans(work: list[ScheduledSeq], seqs: list[Sequence],
                         chunk: int = 256) -> list[tuple[int, int, int]]:
    """(row, first, end): the positions whose logits give the prompt logprobs this step asks
    for, ``chunk`` positions at a time (positions < the last prompt token predict the prompt)."""
    spans = []
    for row, (w, seq) in enumerate(zip(work, seqs)):
        last = min(w.seq_len, seq.num_prompt_tokens - 1)
        if seq.sampling_params.prompt_logprobs is None or w.start_pos >= last:
            continue
        spans += [(row, pos, min(pos + chunk, last)) for pos in range(w.start_pos, last, chunk)]
    return spans


def _to_output(sampled: SampledTokens) -> SamplerOutput:
    """The step's results on the host, in one transfer: ids, ranks and logprobs side by side
    as float64 (exact for token ids and ranks, and for float32 logprobs)."""
    if sampled.logprobs is None:
        return SamplerOutput(sampled.token_ids.tolist())
    k = sampled.top_ids.shape[1]
    rows = torch.cat([sampled.token_ids[:, None], sampled.ranks[:, None], sampled.top_ids,
                      sampled.logprobs[:, None], sampled.top_logprobs],
                     dim=1).to(torch.float64).tolist()  # [S, 3 + 2k]
    token_ids = [int(row[0]) for row in rows]
    return SamplerOutput(token_ids, TopLogprobs(
        token_ids, [row[2 + k] for row in rows], [int(row[1]) for row in rows],
        [[int(t) for t in row[2:2 + k]] for row in rows], [row[3 + k:] for row in rows]))
