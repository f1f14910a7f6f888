"""LLMEngine: add requests, step, abort. Single-threaded; the caller drives ``step()``.

Asynchronous scheduling (``async_scheduling``, vLLM V1's): each ``step()`` schedules and launches
step N+1 while the device still runs step N (the launch queues the work and returns; a decode's
input token sampled by step N is read on the device), then waits for step N's tokens and applies
them (scheduler update, stop checks, detokenizing, outputs) while step N+1 runs. So host work
hides behind device work, and ``step()`` returns step N's outputs: one call late. A sequence
that stopped at step N computes one extra token in step N+1, dropped. Where step N sampled for
a request with a grammar or bad words, step N+1's masks depend on its tokens: step N+1's forward
is launched, step N applied while it runs, then step N+1's sampling launched with the masks.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time

import torch

from hifc.config import EngineConfig
from hifc.core.kv_manager import KVCacheManager
from hifc.core.outputs import SamplerOutput
from hifc.core.preemption import PreemptionPolicy
from hifc.core.prefix_policy import PrefixReadPolicy
from hifc.core.scheduler import Scheduler, SchedulerLimits, SchedulerOutput
from hifc.core.sequence import Sequence, SequenceStatus
from hifc.core.store_level import StoreLevel
from hifc.engine.bad_words import BadWords
from hifc.engine.detokenizer import IncrementalDetokenizer
from hifc.engine.limits import (ResolvedLimits, resolve_device, resolve_dtype, resolve_kv_dtype,
                                resolve_limits)
from hifc.engine.logprobs import LogprobsBuilder
from hifc.engine.model_salt import model_salt
from hifc.engine.outputs import RequestMetrics, RequestOutput
from hifc.engine.prompts import (check_sampling_params, resolve_max_tokens, stop_token_ids,
                                 tokenize_prompt)
from hifc.engine.request_state import CompletionState, RequestState
from hifc.engine.swaps import SwapTracker, TierPrefixStore
from hifc.engine.threads import apply_cpu_threads
from hifc.layers.attention import AttentionBackend, TorchAttentionBackend
from hifc.loader import LoadedModel, load_model
from hifc.layers.tensor_parallel import SINGLE
from hifc.parallel.config import replica_config
from hifc.parallel.tensor_parallel import start_tensor_parallel
from hifc.parallel.tp_control import WorkerSetup
from hifc.parallel.tp_driver import TPDriver
from hifc.parallel.tp_launch import shard_arch, shard_scales
from hifc.runtime.cuda_graphs import chunk_graph_tokens
from hifc.runtime.kv_cache import allocate_kv_cache, kv_cache_scales, scale_digest
from hifc.runtime.model_runner import ModelRunner
from hifc.runtime.step_result import LaunchedStep
from hifc.runtime.sampling_inputs import StepConstraints
from hifc.runtime.swapper import KVSwapper
from hifc.sampling_params import SamplingParams
from hifc.structured.grammar import BitmaskFiller, GrammarCompiler
from hifc.tiers.factory import geometry_of
from hifc.tiers.flash.arbiter import DeviceShare
from hifc.tiers.geometry import KVGeometry

logger = logging.getLogger(__name__)


FP8_MIN_CAPABILITY = (8, 9)  # Triton converts float8_e4m3fn on Ada and Hopper GPUs and later
# torch's cuDNN and flash attention, the Triton backend's fused prompt path, run on Ampere and later
FUSED_PROMPT_MIN_CAPABILITY = (8, 0)


def attention_backend(name: str, device: torch.device, kv_dtype: torch.dtype,
                      num_layers: int, max_chunk_tokens: int = 0) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if device.type != "cuda":
        raise ValueError("attention_backend 'triton' needs a CUDA device")
    capability = torch.cuda.get_device_capability(device)
    if kv_dtype == torch.float8_e4m3fn and capability < FP8_MIN_CAPABILITY:
        raise ValueError(f"kv_cache_dtype fp8 with the triton attention backend needs a GPU "
                         f"of compute capability 8.9 or later (this one: "
                         f"{capability[0]}.{capability[1]}); use attention_backend torch")
    from hifc.layers.triton_attention import TritonAttentionBackend
    return TritonAttentionBackend(
        dense_prefill=None if capability >= FUSED_PROMPT_MIN_CAPABILITY else False,
        num_layers=num_layers, max_chunk_tokens=max_chunk_tokens)


@dataclasses.dataclass(frozen=True)
class _InFlight:
    """A launched step whose tokens the engine has not applied yet: its schedule, its
    sequences' completions (as scheduled), when its launch began (perf_counter) and whether a
    sequence with a grammar or bad words samples in it."""

    out: SchedulerOutput
    completions: list[CompletionState]
    launched: LaunchedStep
    launch_time: float
    constrains_next: bool


class LLMEngine:
    def __init__(self, config: EngineConfig, device_share: DeviceShare | None = None):
        """One engine on one device. ``device_share``: its flash device's arbiter, where other
        replicas share the device (``hifc.parallel`` passes it)."""
        if config.parallel.data_parallel_size > 1:
            raise ValueError("an LLMEngine is one replica: build data_parallel_size > 1 with "
                             "hifc.parallel.data_parallel.build_engine (LLM and hifc serve do)")
        config = replica_config(config, 0)  # a flash_path template names replica 0's file
        self.config = config
        self.device = resolve_device(config)
        self.dtype = resolve_dtype(config, self.device)
        self.cpu_threads = apply_cpu_threads(config.cpu_threads, self.device)
        torch.manual_seed(config.seed)
        # rank 0 of a tensor-parallel engine (None: one rank); see hifc.parallel.tp_driver
        self.tp: TPDriver | None = start_tensor_parallel(config, self.device)
        try:
            self._build(config, device_share)
        except BaseException:
            self._stop_workers()
            raise

    def _build(self, config: EngineConfig, device_share: DeviceShare | None) -> None:
        shard = self.tp.shard if self.tp is not None else SINGLE
        loaded: LoadedModel = load_model(config.model, self.dtype, self.device, config.seed,
                                         shard, config.hf_overrides)
        self.model_name = loaded.name
        self.arch = loaded.arch
        self.tokenizer = loaded.tokenizer
        self.kv_dtype = resolve_kv_dtype(config, self.dtype)
        kv_arch = shard_arch(self.arch, shard.size)  # this rank's KV heads
        self.limits: ResolvedLimits = resolve_limits(config, kv_arch, self.dtype, self.device,
                                                     self.kv_dtype)
        if self.tp is not None:
            self.tp.setup(WorkerSetup(self.limits.num_gpu_blocks, self.limits.max_model_len,
                                      self.limits.max_num_batched_tokens))
        kv_cache = allocate_kv_cache(kv_arch, self.limits.num_gpu_blocks, config.block_size,
                                     self.kv_dtype, self.device)
        # a float8 cache's scales [L, 2, Hkv], fixed before any block is written
        kv_scales = kv_cache_scales(self.kv_dtype, kv_arch,
                                    shard_scales(loaded.kv_scales, shard), self.device)
        self.runner = ModelRunner(
            loaded.model, kv_cache,
            attention_backend(config.attention_backend, self.device, self.kv_dtype,
                              self.arch.num_hidden_layers, self.limits.max_num_batched_tokens),
            config.block_size, self.device, config.seed, kv_scales, followers=self.tp)
        # after the KV cache exists, before any sequence holds a block; CPU / torch backend:
        # decode stays unpadded
        self.runner.start_up(
            self.limits.max_model_len, config.max_num_seqs, self.limits.max_num_batched_tokens,
            tune=config.tune_gemms, capture=not config.enforce_eager,
            chunk_tokens=chunk_graph_tokens(config.long_prefill_token_threshold,
                                            self.limits.max_model_len))
        # the KV blocks' shape, dtype and scales: names the model for the prefix cache (and a
        # persistent store, see model_salt) and shapes the tier's records
        self.kv_geometry = geometry_of(kv_cache, scale_digest(kv_scales))
        self.model_salt = model_salt(config.model, config.seed, self.arch, self.kv_geometry)
        self.kv_manager = KVCacheManager(
            self.limits.num_gpu_blocks, config.block_size,
            salt=self.model_salt if config.enable_prefix_caching else None)
        self.tier = _build_tier(config, self.kv_geometry, kv_cache.device, device_share,
                                self.tp)
        self.preemption = PreemptionPolicy(config.preemption_mode,
                                           self.tier.block_bytes if self.tier else 0)
        store = self._store_level() if self._uses_prefix_store() else None
        self.scheduler = Scheduler(
            SchedulerLimits(config.max_num_seqs, self.limits.max_num_batched_tokens,
                            self.limits.max_model_len, config.enable_chunked_prefill,
                            config.long_prefill_token_threshold,
                            config.prefill_attention_budget),
            self.kv_manager, self.preemption, self.tier, store)
        swapper = (KVSwapper(self.tier, kv_cache, self.model_salt if store else None)
                   if self.tier else None)
        self.swaps = SwapTracker(self.scheduler, self.preemption, swapper,
                                 store.policy.read_bandwidth if store else None)
        self._requests: dict[str, RequestState] = {}
        self._completions: dict[str, CompletionState] = {}  # by sequence id, while unfinished
        self._logprobs = LogprobsBuilder(self.tokenizer)
        self._grammars: GrammarCompiler | None = None  # made for the first structured request
        self._bitmasks: BitmaskFiller | None = None
        self._arrivals = itertools.count()
        self._eos = stop_token_ids(self.tokenizer, self.arch)
        self._closed = False
        # may be switched between step() calls (a benchmark compares both on one engine), but
        # not on under tensor parallelism
        self.async_scheduling = (config.async_scheduling if config.async_scheduling is not None
                                 else self.device.type == "cuda" and self.tp is None)
        self._in_flight: _InFlight | None = None  # async_scheduling: launched, not applied
        self._last_ready = 0.0  # perf_counter when the last applied step's tokens arrived
        self.num_steps = 0
        self.num_overlapped_steps = 0  # steps applied while the next one ran
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0

    def _uses_prefix_store(self) -> bool:
        """The flash prefix store backs the GPU prefix cache (a flash tier that keeps one, and
        prefix caching on)."""
        return (self.tier is not None and self.config.tier.stores_prefixes
                and self.kv_manager.prefix_caching)

    def _store_level(self) -> StoreLevel:
        config = self.config
        policy = PrefixReadPolicy(config.tier.prefix_store_read, self.tier.block_bytes,
                                  config.block_size, self.preemption.prefill_speed)
        # 'evicted' keeps written the cached blocks that the next step could evict
        lookahead = self.limits.max_num_batched_tokens // config.block_size + 1
        return StoreLevel(TierPrefixStore(self.tier, self.model_salt), policy,
                          config.tier.prefix_store, self.kv_manager.pool, lookahead)

    @classmethod
    def from_options(cls, model: str | None = None, **options) -> "LLMEngine":
        return cls(EngineConfig.from_options(model, **options))

    # ---- requests -------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """Validate a prompt and return its token ids (clear ValueErrors for bad input)."""
        return tokenize_prompt(prompt, self.tokenizer, self.arch.vocab_size,
                               self.limits.max_model_len, self.model_name)

    def check_sampling_params(self, params: SamplingParams) -> SamplingParams:
        """ValueError unless this engine can serve ``params`` (see
        ``hifc.engine.prompts.check_sampling_params``; and a valid grammar)."""
        check_sampling_params(params, self.arch.vocab_size, self.config.max_logprobs,
                              self.tokenizer, self.model_name)
        if params.structured_outputs is not None:
            self._grammar_compiler().compile(params.structured_outputs)
        return params

    def add_request(self, request_id: str, prompt: str | list[int],
                    sampling_params: SamplingParams | None = None, *,
                    prompt_ids: list[int] | None = None,
                    arrival_time: float | None = None) -> None:
        """Queue a request (``n`` sequences). ``prompt_ids``: what ``tokenize_prompt(prompt)``
        returned, for a caller that tokenized first (it is not tokenized and checked again);
        ``arrival_time``: when it arrived (``time.time()``; default now)."""
        params = sampling_params or SamplingParams()
        self.check_sampling_params(params)
        seq_ids = _sequence_ids(request_id, params.n)
        if request_id in self._requests or any(
                i in self._completions or self.scheduler.is_tracking(i) for i in seq_ids):
            raise ValueError(f"request id {request_id!r} is already in use")
        ids = self.tokenize_prompt(prompt) if prompt_ids is None else prompt_ids
        completion_params = self._completion_params(params, len(ids))
        grammar = (self._grammar_compiler().compile(params.structured_outputs)
                   if params.structured_outputs is not None else None)
        bad_words = BadWords(params.bad_words, self.tokenizer) if params.bad_words else None
        request = RequestState(request_id, prompt if isinstance(prompt, str) else None, ids,
                               params, RequestMetrics(arrival_time or time.time()))
        for index, (seq_id, p) in enumerate(zip(seq_ids, completion_params)):
            seq = Sequence(seq_id, ids, p, self._eos, next(self._arrivals))
            self.scheduler.add(seq)  # ValueError for a prompt the pool can never hold
            detokenizer = (IncrementalDetokenizer(self.tokenizer, p.skip_special_tokens, p.stop,
                                                  p.include_stop_str_in_output)
                           if self.tokenizer and p.detokenize else None)
            completion = CompletionState(
                index, seq, request, detokenizer, bad_words=bad_words,
                grammar=self._grammars.matcher(grammar) if grammar is not None else None)
            if p.logprobs is not None:
                completion.start_logprobs(self._logprobs)
            request.completions.append(completion)
            self._completions[seq_id] = completion
        self._requests[request_id] = request
        self.num_prompt_tokens += len(ids)

    def _completion_params(self, params: SamplingParams, prompt_len: int) -> list[SamplingParams]:
        """Each sequence's parameters: n = 1, max_tokens resolved (None: what the context leaves
        after the prompt), seeds seed, seed + 1, ... (vLLM's). Only the first sequence computes
        prompt logprobs (they are the request's): the others find the prompt's blocks in the
        prefix cache as the first one computes them, so the prompt is prefilled once."""
        max_tokens = resolve_max_tokens(params, prompt_len, self.limits.max_model_len)
        if params.n == 1 and max_tokens == params.max_tokens:
            return [params]
        first = dataclasses.replace(params, n=1, max_tokens=max_tokens)
        others = dataclasses.replace(first, prompt_logprobs=None)
        return [dataclasses.replace(
            first if i == 0 else others,
            seed=None if params.seed is None else (params.seed + i) % 2**63)
            for i in range(params.n)]

    def _grammar_compiler(self) -> GrammarCompiler:
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.arch.vocab_size, self._eos)
            self._bitmasks = self._grammars.bitmask_filler()
        return self._grammars

    def token_text(self, token_id: int) -> str | None:
        """A token's text, decoded alone (None without a tokenizer)."""
        return self._logprobs.token_text(token_id)

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            request = self._requests.pop(rid, None)
            if request is None:
                continue
            for completion in request.completions:
                self._completions.pop(completion.seq.request_id, None)
                self.scheduler.finish(completion.seq, SequenceStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        """True while a request is unfinished or swap I/O (of aborted requests too) is pending;
        ``step()`` completes that I/O and releases its blocks. (A step left in flight by
        asynchronous scheduling then holds only tokens to drop: the next ``step()`` or
        ``close()`` applies it.)"""
        return bool(self._requests) or bool(self.swaps.num_pending)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- stepping -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; return an output for every request that advanced or finished (as
        its ``output_kind`` asks: everything so far, what is new, or only the final one).

        Schedule (with the swaps that finished or start now, see ``SwapTracker``), launch the
        batch on the device, then apply what was sampled. With ``async_scheduling`` the batch
        launched here is applied by the next call, which returns its outputs: this call
        applies the one launched by the call before, while the new one runs."""
        previous, self._in_flight = self._in_flight, None
        if previous is not None and not self.async_scheduling:
            return self._apply(previous)  # switched off since: end the step in flight first
        step, results = self._launch(self.swaps.schedule(wait=previous is None), previous)
        if previous is not None:
            if results is None:  # not needed before the new step's sampling: applied now
                results = self._apply(previous)
            self.num_overlapped_steps += step is not None
        if step is None or self.async_scheduling:
            self._in_flight = step
            return results or []
        return self._apply(step)

    def _launch(self, out: SchedulerOutput, previous: _InFlight | None
                ) -> tuple[_InFlight | None, list[RequestOutput] | None]:
        """Queue the step on the device (None: nothing scheduled), and the outputs of
        ``previous`` if it had to be applied first (None: it was not). A step whose grammar
        masks or bad-word bans depend on tokens ``previous`` sampled applies it between its
        forward and its sampling, while the device runs the forward."""
        t0 = time.perf_counter()
        completions = [self._completions[w.request_id] for w in out.scheduled]
        now = time.time()
        for completion in completions:
            metrics = completion.request.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
        sampling = [c for w, c in zip(out.scheduled, completions) if w.samples]
        forward = self.runner.launch_forward(out, [c.seq for c in completions])
        constrained = [(row, c) for row, c in enumerate(sampling)
                       if c.grammar is not None or c.bad_words is not None]
        results = None
        if constrained and previous is not None and previous.constrains_next:
            results = self._apply(previous)  # its tokens decide the masks
        launched = self.runner.launch_sampling(forward, self._constraints(constrained))
        if out.is_empty:
            return None, results
        self.num_steps += 1
        return _InFlight(out, completions, launched, t0, bool(constrained)), results

    def _apply(self, step: _InFlight) -> list[RequestOutput]:
        """Wait for a launched step's tokens and apply them; its outputs."""
        sampled = step.launched.result()
        ready = time.perf_counter()
        if step.out.num_prefill_tokens:  # the device began it after the step before ended
            self.preemption.prefill_speed.add(step.out.num_prefill_tokens,
                                              ready - max(step.launch_time, self._last_ready))
        self._last_ready = ready
        return self._update(step.out, step.completions, sampled)

    def _constraints(self, constrained: list[tuple[int, CompletionState]]
                     ) -> StepConstraints | None:
        """This step's bad-word bans and grammar bitmasks, by row of the sequences that
        sample (``constrained``: (row, completion) of those with a grammar or bad words)."""
        # a sequence that ended with the tokens applied since the step was scheduled samples a
        # token that is dropped: it needs no mask (a finished grammar has none)
        constrained = [(row, c) for row, c in constrained if not c.seq.status.is_finished]
        if not constrained:
            return None
        step = StepConstraints()
        for row, c in constrained:
            if c.bad_words is not None:
                banned = c.bad_words.banned_next(c.seq.output_token_ids)
                step.banned_rows.extend([row] * len(banned))
                step.banned_tokens.extend(banned)
        grammars = [(row, c.grammar) for row, c in constrained if c.grammar is not None]
        if grammars:
            step.grammar_rows = [row for row, _ in grammars]
            step.grammar_bitmask = self._bitmasks.fill([g for _, g in grammars])
        return step

    def _update(self, out: SchedulerOutput, completions: list[CompletionState],
                sampled: SamplerOutput) -> list[RequestOutput]:
        """Apply a step's results (``completions``: its sequences' completions as scheduled;
        those aborted since get nothing)."""
        for row, part in sampled.prompt_logprobs.items():
            completions[row].request.add_prompt_logprobs(part, self._logprobs)
        rows = {w.request_id: row for row, w in enumerate(out.sampling)}  # -> sampled rows
        by_id = {c.seq.request_id: c for c in completions}
        updated = self.scheduler.update(out, sampled, {i: c.seq for i, c in by_id.items()})
        self.num_generated_tokens += len(updated)
        advanced: dict[str, RequestState] = {}
        for seq in updated:
            completion = by_id[seq.request_id]
            self._take_token(completion, sampled, rows[seq.request_id])
            advanced[completion.request.request_id] = completion.request
        now = time.time()
        results = []
        for request in advanced.values():
            output = request.advance(now)
            if output is not None:
                results.append(output)
            if request.finished:
                del self._requests[request.request_id]
                for completion in request.completions:
                    self._completions.pop(completion.seq.request_id, None)
        return results

    def _take_token(self, completion: CompletionState, sampled: SamplerOutput, row: int) -> None:
        """Record a sequence's new token; end it at a stop string or a finished grammar."""
        seq = completion.seq
        stop = completion.record(sampled, row)
        # not finished: running, or preempted after the step was launched (asynchronous)
        if stop is not None and (not seq.status.is_finished
                                 or seq.status is SequenceStatus.FINISHED_LENGTH):
            seq.stop_reason = stop
            if seq.status is SequenceStatus.FINISHED_LENGTH:
                seq.status = SequenceStatus.FINISHED_STOPPED  # came with the last allowed token
            else:
                self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)
        elif completion.grammar is not None and completion.grammar.finished \
                and not seq.status.is_finished:
            self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)

    def close(self) -> None:
        """Abort what is left, wait for I/O in flight, write the cached GPU blocks that the
        flash prefix store lacks (at most ``prefix_store_flush_seconds``), so that the next
        engine on the file starts warm, and release the swap tier."""
        self.abort_request(list(self._requests))
        if self._in_flight is not None:  # its tokens are dropped: every request is aborted
            in_flight, self._in_flight = self._in_flight, None
            self._apply(in_flight)
        self.swaps.drain()
        if self.tier is not None and not self._closed:
            if self.tp is None or self.tp.lost is None:  # every rank writes its shard
                self.swaps.flush(self.config.tier.prefix_store_flush_seconds)
            self.tier.close()
            self.swaps.after_close()
        self._closed = True
        self._stop_workers()

    def _stop_workers(self) -> None:
        """Stop the tensor-parallel workers (after the tier released their movers)."""
        if self.tp is not None:
            self.tp.shutdown()

    def stats(self) -> dict[str, float | int]:
        sched = self.scheduler
        return {
            "steps": self.num_steps,
            "overlapped_steps": self.num_overlapped_steps,
            "graph_decode_steps": self.runner.num_graph_decode_steps,
            "graph_chunk_steps": self.runner.num_graph_chunk_steps,
            "prompt_tokens": self.num_prompt_tokens,
            "generation_tokens": self.num_generated_tokens,
            "preemptions": sched.num_preemptions,
            "recomputed_sequences": sched.num_recomputed_sequences,
            "swap_failures": sched.num_swap_failures,
            "swap_out_blocks": sched.swap_out_blocks,
            "swap_in_blocks": sched.swap_in_blocks,
            "prefix_cache_queries": sched.prefix_cache_queries,
            "prefix_cache_hits": sched.prefix_cache_hits,
            **self._prefix_store_stats(),
            **self.swaps.stats(),
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "swapped": len(sched.swapped) + len(sched.swapping_out) + len(sched.swapping_in),
            "loading_prefix": len(sched.loading),
            # the rates the prefix cost rule compares (None until measured)
            "prefill_tokens_per_s": self.preemption.prefill_speed.rate,
            "tier_read_bytes_per_s": (self.swaps.read_bandwidth.rate
                                      if self.swaps.read_bandwidth else None),
            "gpu_blocks_free": self.kv_manager.num_free_blocks,
            "gpu_blocks_total": self.kv_manager.num_total_blocks,
            "gpu_blocks_cached": self.kv_manager.num_cached_free_blocks,
            "tier_blocks_used": sched.tier_blocks_used,
            "tier_blocks_total": self.tier.num_blocks if self.tier else 0,
        }


    def _prefix_store_stats(self) -> dict[str, float | int | None]:
        """The flash prefix store's counters: what the engine admitted (queries, hits and the
        cost rule's choices, in tokens) and what the tier moved and holds (zeros without)."""
        store = self.scheduler.store
        if store is None:
            return {key: 0 for key in PREFIX_STORE_KEYS}
        tier = self.tier.prefix.stats()
        return {**store.stats(),
                **{key: tier[key] for key in ("prefix_store_bytes_read",
                                              "prefix_store_bytes_written",
                                              "prefix_store_blocks")}}


# the flash prefix store's keys in stats() (tokens, bytes, blocks)
PREFIX_STORE_KEYS = ("prefix_store_queries", "prefix_store_hits", "prefix_store_recomputed",
                     "prefix_store_read_tokens", "prefix_store_reads",
                     "prefix_store_read_failures", "prefix_store_evicted_unstored",
                     "prefix_store_bytes_read", "prefix_store_bytes_written",
                     "prefix_store_blocks")

def _sequence_ids(request_id: str, n: int) -> list[str]:
    """The ids of a request's sequences: its own for n = 1, else ``{i}_{request_id}``."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
    return [request_id] if n == 1 else [f"{i}_{request_id}" for i in range(n)]


def _build_tier(config: EngineConfig, geometry: KVGeometry, device: torch.device,
                device_share: DeviceShare | None, tp: TPDriver | None):
    """The swap tier (None: none configured); with tensor parallelism, rank 0's block space
    and mover, the workers' movers driven through ``tp``."""
    if not config.tier.enabled:
        return None
    from hifc.tiers import make_tier
    return make_tier(config.tier, geometry, device=device, device_share=device_share, peers=tp)
