"""Runs one scheduled step on the device: inputs -> model -> logits -> sampled tokens.

``launch_forward`` then ``launch_sampling`` queue a step and return at once (``LaunchedStep``;
its ``result()`` waits for the sampled ids on the host). A decode's ``PENDING_TOKEN`` is the id
the previous launched step sampled for that sequence: it is copied into the step's input on the
device, so the step can be launched before the host has seen the previous step's results
(asynchronous scheduling).

With tensor parallelism the engine's runner (rank 0) announces each step to the other ranks'
runners (``followers``) before computing it; they run the same forward pass and logits
(``follow``: the model's collectives pair up) and sample nothing. (Asynchronous scheduling is
off under tensor parallelism: the followers would need the pending tokens.)
"""
from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import Protocol

import torch

from hifc.core.scheduler import ScheduledSeq, SchedulerOutput
from hifc.core.sequence import Sequence
from hifc.layers import sampling_ops, triton_gemv, triton_host_io
from hifc.layers.attention import AttentionBackend, AttentionContext
from hifc.layers.gemm_tuning import Tuned, prompt_rows
from hifc.layers.linear import tune_projections
from hifc.layers.sampler import SampledTokens, Sampler
from hifc.layers.triton_jit import kernel_compiles, meet_kernels
from hifc.runtime import inputs
from hifc.runtime.cuda_graphs import DecodeGraphs, capture_sizes, graphs_unsupported_reason
from hifc.runtime.sampling_inputs import (PenaltyRows, StepConstraints, StepPacker,
                                          build_sampling_batch)
from hifc.runtime.step_result import DeviceTokens, HostSlots, LaunchedStep, PromptLogprobsPart
from hifc.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# the start-up warm-up's step where the backend names none: the sampler's passes still compile
SAMPLER_WARM_UP = [(0, 2)]


def warm_up_steps(shapes: list[tuple[int, int]], max_model_len: int,
                  num_slots: int) -> list[tuple[int, int]]:
    """The (cached context, new tokens) of ``shapes`` (the backend's ``warm_up_shapes``) that
    fit the model's length and ``num_slots`` KV slots (a step's context reads the cache's first
    block again and again), or SAMPLER_WARM_UP where the backend names none."""
    return [(c, n) for c, n in shapes or SAMPLER_WARM_UP
            if c + n <= max_model_len and n <= num_slots]


class StepFollowers(Protocol):
    """The other tensor-parallel ranks' runners, as rank 0 drives them."""

    def announce(self, scheduled: list[ScheduledSeq],
                 logprob_spans: list[tuple[int, int, int]]) -> None:
        """Send them a step: they ``follow`` it while this rank computes it."""


@dataclass
class QueuedForward:
    """A step whose forward is queued on the device and whose sampling is not yet: its schedule
    and sequences, the tokens the step before sampled (on the device), the sampling rows'
    logits, and for prompt logprobs the spans, hidden states and query offsets of an eager
    forward."""

    out: SchedulerOutput
    seqs: list[Sequence]
    previous: DeviceTokens | None
    logits: torch.Tensor | None = None  # [S, V]
    spans: list[tuple[int, int, int]] = field(default_factory=list)
    hidden: torch.Tensor | None = None
    query_start_loc: list[int] | None = None


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
        self._last_sampled: DeviceTokens | None = None  # the last launched step's ids
        self.host_slots: HostSlots | None = None  # where sampled ids reach the host (CUDA)
        self.followers = followers  # the other tensor-parallel ranks (None: one rank)
        self.tuned_projections: list[Tuned] = []  # tune_projections' outcomes

    @torch.inference_mode()
    def start_up(self, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int, *,
                 tune: bool, capture: bool, chunk_tokens: int = 0) -> None:
        """Before any sequence holds a KV block: choose the projections' matrix kernels by
        timing (``tune``, CUDA only: ``tune_projections``), set up padded decode steps where
        this device and backend allow them (``_padded_decode_graphs``: their CUDA graphs with
        ``capture``, else the same padded forwards run eagerly) and warm up prompt steps
        (``warm_up``). Every pass (each graph's forward, each warm-up step and the sampler's
        and backend's passes) first meets its Triton kernels within one ``meet_kernels``; the
        variants they met compile side by side (in processes of their own, started at the first
        variant met) while this thread times the GEMMs (the CPU's work beside the GPU's); then
        the passes that met new variants run again for real and the graphs are captured (over
        the tuned GEMMs). An eager step's last layer projects one row per sequence that
        samples, so the warm-up first runs a step of M prompts for each M that
        ``triton_gemv.row_variants`` gives for max_num_seqs."""
        tuning = (partial(self.tune_projections, max_num_seqs, max_num_batched_tokens)
                  if tune else None)
        if triton_host_io.usable(self.device):
            self.host_slots = HostSlots(max_num_seqs)
        self._run_passes(self._padded_decode_graphs(max_model_len, max_num_seqs, chunk_tokens),
                         capture, self._warm_up_steps(max_model_len), tuning,
                         triton_gemv.row_variants(max_num_seqs))

    def _run_passes(self, graphs: DecodeGraphs | None, capture: bool,
                    steps: list[tuple[int, int]], tuning: Callable[[], None] | None,
                    kept_rows: list[int]) -> None:
        """``start_up``'s passes: ``graphs``' forwards and the warm-up parts (``steps`` and
        ``kept_rows``) meet their kernels, which compile while ``tuning`` runs; then the
        capture (with ``capture``) and the warm-up parts that met new variants, again."""
        started, compiled = time.perf_counter(), len(kernel_compiles())
        num_forwards = graphs.num_forwards if graphs is not None else 0  # parts before the steps
        warm_parts = self._warm_up_parts(steps, kept_rows)
        num_steps = max(len(warm_parts) - 1, 0)  # the parts before the sampler's passes
        again = meet_kernels(chain(graphs.forward_parts(capture) if graphs is not None else (),
                                   warm_parts),
                             every=self.model.tp.size > 1, meanwhile=tuning)
        split = bisect.bisect_left(again, num_forwards)
        if graphs is not None:
            if capture:
                graphs.capture(again[:split])
            self.decode_graphs = graphs
        for index in again[split:]:
            warm_parts[index - num_forwards]()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        logger.info("started up in %.1f s: %d padded forwards (%d run again before their "
                    "capture) and %d warm-up prompt steps (%d run again) met their kernels "
                    "(%d compiled)", time.perf_counter() - started, num_forwards, split,
                    num_steps, sum(index < num_forwards + num_steps for index in again[split:]),
                    len(kernel_compiles()) - compiled)

    def tune_projections(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """On CUDA, choose each projection shape's matrix kernel by timing
        (:mod:`hifc.layers.gemm_tuning`) at the decode graphs' batch sizes and, for prompt
        steps, the row counts serving the token budget (``prompt_rows``); before the graphs
        are captured."""
        if self.device.type != "cuda":
            return
        rows = capture_sizes(max_num_seqs) + prompt_rows(max_num_batched_tokens)
        self.tuned_projections = tune_projections(self.model, rows)
        for tuned in self.tuned_projections:
            logger.debug("%s", tuned)

    def _padded_decode_graphs(self, max_model_len: int, max_num_seqs: int,
                              chunk_tokens: int) -> DecodeGraphs | None:
        """Decode-only steps padded to the batch sizes of ``capture_sizes`` (with
        ``chunk_tokens``, steps of decodes plus one prompt chunk of up to that many tokens
        too), run from persistent input buffers, not yet compiled or captured; None where this
        device or backend cannot pad them (decode steps then run unpadded). Replayed from CUDA
        graphs, or the same padded forwards run eagerly (``enforce_eager``, so that eager and
        graph runs compute bit-identical logits: the matrix kernels' results depend on the
        batch size they run at)."""
        num_slots = self.kv_cache.shape[2] * self.block_size
        reason = graphs_unsupported_reason(self.device, self.backend, num_slots)
        if reason is not None:
            logger.info("decode steps run unpadded (no CUDA graphs): %s", reason)
            return None
        return self._decode_graphs(max_model_len, capture_sizes(max_num_seqs), chunk_tokens)

    def _decode_graphs(self, max_model_len: int, batch_sizes: list[int],
                       chunk_tokens: int) -> DecodeGraphs:
        return DecodeGraphs(self.model, self.kv_caches, self.backend, self.block_size,
                            max_model_len, batch_sizes, self.device, self.kv_scales,
                            chunk_tokens)

    def use_padded_decode(self, max_model_len: int, batch_sizes: list[int],
                          capture: bool, chunk_tokens: int = 0) -> None:
        """Run decode-only steps of up to max(batch_sizes) sequences padded to the next size
        (and with ``chunk_tokens``, such decodes plus one prompt chunk of up to that many
        tokens), from persistent input buffers: replayed from CUDA graphs captured now
        (capture=True, CUDA only) or run eagerly (capture=False: the same computation, whose
        kernels compile now on CUDA)."""
        graphs = self._decode_graphs(max_model_len, batch_sizes, chunk_tokens)
        if capture:
            graphs.capture()
        elif self.device.type == "cuda":
            graphs.compile_kernels()
        self.decode_graphs = graphs

    def _warm_up_steps(self, max_model_len: int) -> list[tuple[int, int]]:
        """The warm-up's default steps: the backend's ``warm_up_shapes`` that fit, on CUDA;
        none elsewhere, where nothing compiles."""
        if self.device.type != "cuda":
            return []
        return warm_up_steps(self.backend.warm_up_shapes(), max_model_len,
                             self.kv_cache.shape[2] * self.block_size)

    def _warm_up_parts(self, steps: list[tuple[int, int]],
                       kept_rows: list[int]) -> list[Callable[[], None]]:
        """``warm_up``'s passes: an eager step of M two-token prompts for each M of
        ``kept_rows`` (their last layer's projections run on M rows), one of one prompt chunk
        per (cached context, new tokens) of ``steps``, then the sampler's passes on the latest
        step's logits and the backend's warm-up (none without steps)."""
        if not steps:
            return []
        greedy = SamplingParams(temperature=0.0)
        num_blocks = self.kv_cache.shape[2]
        work = [[ScheduledSeq("warm-up", [0, 0], 0, [i % num_blocks], greedy) for i in range(m)]
                for m in kept_rows]
        for context, n in steps:
            if context % self.block_size:
                raise ValueError(f"a warm-up context of {context} tokens is not whole blocks")
            blocks = [0] * (context // self.block_size) + list(range(-(-n // self.block_size)))
            work.append([ScheduledSeq("warm-up", [0] * n, context, blocks, greedy)])
        last = {}  # the latest step's logits: one row, as every step's

        def run_step(step: list[ScheduledSeq]) -> None:
            last["logits"] = self.eager_logits(step)

        def passes() -> None:  # on a step's logits the sampler's and the ids' store, then
            # the backend's own
            self.sampler.warm_up(last["logits"])
            if self.host_slots is not None:
                self.host_slots.store(sampling_ops.argmax(last["logits"][:1]))
            self.backend.warm_up(self.model.tp.split(self.model.arch.num_attention_heads),
                                 self.kv_caches[0], self.model.attention_layers)

        return [partial(run_step, step) for step in work] + [passes]

    @torch.inference_mode()
    def warm_up(self, max_model_len: int,
                steps: list[tuple[int, int]] | None = None) -> None:
        """Before any sequence holds a KV block: run an eager step of one prompt chunk for each
        (cached context, new tokens) of ``steps`` (default: the backend's ``warm_up_shapes``
        that fit, on CUDA; none elsewhere, where nothing compiles), then the sampler's passes
        on the last step's logits and the backend's warm-up for what such steps do not reach.
        The context's block table repeats the cache's first block and the new tokens take the
        first blocks, which later sequences overwrite. The kernel variants a first request needs
        (the attention's tile for its prompt's size and its context's length, the sampler's)
        then compile here, not inside that request's first step (1.7-4.5 s on the H200 with an
        empty Triton cache, docs/RESULTS.md). The steps and passes run first within
        ``meet_kernels``, which meets their variants and then compiles them side by side;
        those that met new variants then run again, for real."""
        if steps is None:
            steps = self._warm_up_steps(max_model_len)
        if steps:
            self._run_passes(None, False, steps, None, [])

    @property
    def num_graph_decode_steps(self) -> int:
        """Decode steps replayed from a CUDA graph."""
        graphs = self.decode_graphs
        return self.num_padded_decode_steps if graphs is not None and graphs.graphs else 0

    @property
    def num_graph_chunk_steps(self) -> int:
        """Steps of decodes plus a prompt chunk replayed from a CUDA graph."""
        graphs = self.decode_graphs
        return graphs.num_chunk_steps if graphs is not None and graphs.chunk_graphs else 0

    def eager_logits(self, work: list[ScheduledSeq]) -> torch.Tensor:
        """Compute the step's K/V from unpadded inputs; returns the logits ([S, V]) of the last
        new token of each sequence that samples (S may be 0: prompt chunks only)."""
        return self._eager_step(work, None, [])[0]

    def eager_forward(self, work: list[ScheduledSeq], pending: inputs.PendingInputs | None,
                      every_row: bool) -> tuple[torch.Tensor, list[int]]:
        """Hidden states of the new tokens, and where each sequence's start ([B+1]): of every
        one ([T, H]; ``every_row``, as prompt logprobs need), else of the last new token of
        each sequence that samples ([S, H], in ``work`` order), the only rows the last layer
        attends (every row's K/V written) and runs its output projection and MLP on.
        ``pending``: input ids the previous step sampled, on the device."""
        meta = inputs.build_attention_metadata(work, self.block_size, self.device)
        qsl = meta.query_start_loc_cpu
        kept = None  # every row: asked for, or every row samples (a decode-only step)
        if not every_row and sum(w.samples for w in work) < qsl[-1]:
            kept = inputs.build_kept_rows(work, meta, self.device)
        ctx = AttentionContext(meta, self.kv_caches, self.backend, self.model.attention_layers,
                               self.kv_scales, kept)
        input_ids = inputs.build_input_ids(work, self.device)
        if pending is not None:
            input_ids.index_copy_(0, *pending.gather())
        positions = inputs.build_positions(work, self.device)
        return self.model(input_ids, positions, ctx, None if kept is None else kept.index), qsl

    def _eager_step(self, work: list[ScheduledSeq], pending: inputs.PendingInputs | None,
                    spans: list[tuple[int, int, int]]
                    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """An eager forward: the samplers' logits ([S, V]), and ``eager_forward``'s hidden
        states (every row's where ``spans`` ask for prompt logprobs) and query starts."""
        hidden, query_start_loc = self.eager_forward(work, pending, every_row=bool(spans))
        states = hidden
        if spans:
            states = hidden.index_select(
                0, inputs.build_logits_indices(work, query_start_loc, self.device))
        return self.model.compute_logits(states), hidden, query_start_loc

    def _padded_logits(self, work: list[ScheduledSeq], pending: inputs.PendingInputs | None,
                       spans: list[tuple[int, int, int]]) -> torch.Tensor | None:
        """Logits ([S, V]) of the samplers of a decode-only step, or of decodes plus a prompt
        chunk, run padded (None: the step runs eagerly, as one whose ``spans`` ask for prompt
        logprobs does: they need hidden states the padded path does not keep). A one-token
        prompt chunk before the last is a decode-shaped row, not sampled."""
        graphs = self.decode_graphs
        if graphs is None or spans:
            return None
        logits = graphs.run(work, pending)
        if logits is None:
            return None
        self.num_padded_decode_steps += len(work[-1].token_ids) == 1
        if all(w.samples for w in work):
            return logits  # [B, V]
        rows = [i for i, w in enumerate(work) if w.samples]
        return logits[inputs.to_device(rows, torch.long, logits.device)]

    def _pending_inputs(self, work: list[ScheduledSeq],
                        previous: DeviceTokens | None) -> inputs.PendingInputs | None:
        """The step's pending tokens, among the ids ``previous`` (the last launched step)
        sampled; None if the step has none."""
        index, rows = inputs.pending_token_sources(work, previous.rows if previous else {})
        return inputs.PendingInputs(index, rows, previous.token_ids) if index else None

    @torch.inference_mode()
    def launch_forward(self, out: SchedulerOutput, seqs: list[Sequence]) -> QueuedForward:
        """Queue the step's forward: compute the scheduled tokens' K/V and the logits of each
        sequence that finishes its known tokens in this step (``ScheduledSeq.samples``).
        ``seqs``: the scheduled sequences, in ``out.scheduled`` order (their parameters,
        prompts and accepted tokens). Pending tokens come from the step launched just before.
        ``launch_sampling`` queues the rest of the step."""
        if self.penalty_rows is not None:
            self.penalty_rows.release(out.finished_request_ids)
        previous, self._last_sampled = self._last_sampled, None
        work = out.scheduled
        if not work:
            return QueuedForward(out, seqs, previous)
        spans = prompt_logprob_spans(work, seqs)
        if self.followers is not None:
            self.followers.announce(work, spans)
        pending = self._pending_inputs(work, previous)
        hidden = query_start_loc = None
        logits = self._padded_logits(work, pending, spans)
        if logits is None:
            logits, hidden, query_start_loc = self._eager_step(work, pending, spans)
        return QueuedForward(out, seqs, previous, logits, spans, hidden, query_start_loc)

    @torch.inference_mode()
    def launch_sampling(self, forward: QueuedForward,
                        constraints: StepConstraints | None = None) -> LaunchedStep:
        """Queue the sampling of a queued forward (``constraints``: the engine's bans and
        grammar masks, by row of ``out.sampling``) and the prompt logprobs; the launched step.
        The host may do other work between the two launches (the engine applies the step
        before, whose tokens decide the masks) while the device runs the forward."""
        work, seqs = forward.out.scheduled, forward.seqs
        if not work:
            return LaunchedStep(self.device)
        sampling = [seq for w, seq in zip(work, seqs) if w.samples]
        sampled = None
        if sampling:
            sampled = self._sample(forward.logits, sampling, constraints, forward.previous)
            self._last_sampled = DeviceTokens(
                sampled.token_ids,
                {w.request_id: row for row, w in enumerate(forward.out.sampling)})
        prompt_parts = (self._prompt_logprobs(work, seqs, forward.spans, forward.hidden,
                                              forward.query_start_loc)
                        if forward.spans else [])
        return LaunchedStep(self.device, sampled, prompt_parts, self.host_slots)

    @torch.inference_mode()
    def follow(self, work: list[ScheduledSeq], spans: list[tuple[int, int, int]]) -> None:
        """A tensor-parallel rank other than 0: compute this rank's part of a step rank 0
        announced (its K/V, and the logits rank 0 computes, which gather over the ranks)."""
        if not work:
            return
        if self._padded_logits(work, None, spans) is not None:
            return
        _, hidden, query_start_loc = self._eager_step(work, None, spans)
        for row, first, end in spans:
            offset = query_start_loc[row] - work[row].start_pos
            self.model.compute_logits(hidden[offset + first:offset + end])

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence],
                constraints: StepConstraints | None,
                previous: DeviceTokens | None) -> SampledTokens:
        vocab = logits.shape[-1]
        if self.penalty_rows is None and any(s.sampling_params.has_penalties for s in seqs):
            self.penalty_rows = PenaltyRows(vocab, self.device)
        batch = build_sampling_batch(seqs, constraints, self.penalty_rows, self.step_packer,
                                     vocab, previous)
        return self.sampler.sample(logits, batch, self.generator)

    def _prompt_logprobs(self, work: list[ScheduledSeq], seqs: list[Sequence],
                         spans: list[tuple[int, int, int]], hidden: torch.Tensor,
                         query_start_loc: list[int]) -> list[PromptLogprobsPart]:
        """Prompt log-probabilities of the prompt tokens this step's hidden states predict,
        for the rows that ask for them, one ``spans`` entry at a time ([chunk, V] logits)."""
        parts_by_row: dict[int, list] = {}
        for row, first, end in spans:
            seq = seqs[row]
            offset = query_start_loc[row] - work[row].start_pos
            states = hidden[offset + first:offset + end]  # [C, H]
            logprobs = torch.log_softmax(self.model.compute_logits(states).float(), dim=-1)
            targets = inputs.to_device(seq.prompt_token_ids[first + 1:end + 1], torch.long,
                                       self.device)
            parts_by_row.setdefault(row, []).append(sampling_ops.top_logprobs(
                logprobs, targets, seq.sampling_params.prompt_logprobs))
        results = []
        for row, parts in parts_by_row.items():
            w, seq = work[row], seqs[row]
            last = min(w.seq_len, seq.num_prompt_tokens - 1)
            results.append(PromptLogprobsPart(
                row, w.start_pos + 1, seq.prompt_token_ids[w.start_pos + 1:last + 1],
                tuple(torch.cat(t) for t in zip(*parts))))
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
