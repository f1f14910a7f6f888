"""LLMEngine: add requests, step, abort. Single-threaded; the caller drives ``step()``."""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import torch

from hifc.config import EngineConfig
from hifc.core.kv_manager import KVCacheManager
from hifc.core.outputs import SamplerOutput
from hifc.core.preemption import PreemptionPolicy
from hifc.core.scheduler import Scheduler, SchedulerLimits, SchedulerOutput
from hifc.core.sequence import Sequence, SequenceStatus
from hifc.engine.detokenizer import IncrementalDetokenizer
from hifc.engine.limits import (ResolvedLimits, resolve_device, resolve_dtype, resolve_kv_dtype,
                                resolve_limits)
from hifc.engine.model_salt import model_salt
from hifc.engine.outputs import CompletionOutput, RequestOutput
from hifc.engine.prompts import check_sampling_params, tokenize_prompt
from hifc.engine.swaps import SwapTracker
from hifc.engine.threads import apply_cpu_threads
from hifc.layers.attention import AttentionBackend, TorchAttentionBackend
from hifc.loader import LoadedModel, load_model
from hifc.parallel.config import replica_config
from hifc.runtime.kv_cache import allocate_kv_cache, kv_cache_scales, scale_digest
from hifc.runtime.model_runner import ModelRunner
from hifc.runtime.swapper import KVSwapper
from hifc.sampling_params import SamplingParams
from hifc.tiers.factory import geometry_of
from hifc.tiers.flash.arbiter import DeviceShare
from hifc.tiers.geometry import KVGeometry

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    seq: Sequence
    prompt: str | None
    detokenizer: IncrementalDetokenizer | None


FP8_MIN_CAPABILITY = (8, 9)  # Triton converts float8_e4m3fn on Ada and Hopper GPUs and later


def _attention_backend(name: str, device: torch.device, kv_dtype: torch.dtype) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if device.type != "cuda":
        raise ValueError("attention_backend 'triton' needs a CUDA device")
    if kv_dtype == torch.float8_e4m3fn:
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_MIN_CAPABILITY:
            raise ValueError(f"kv_cache_dtype fp8 with the triton attention backend needs a GPU "
                             f"of compute capability 8.9 or later (this one: "
                             f"{capability[0]}.{capability[1]}); use attention_backend torch")
    from hifc.layers.triton_attention import TritonAttentionBackend
    return TritonAttentionBackend()


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
        loaded: LoadedModel = load_model(config.model, self.dtype, self.device, config.seed)
        self.model_name = loaded.name
        self.arch = loaded.arch
        self.tokenizer = loaded.tokenizer
        self.kv_dtype = resolve_kv_dtype(config, self.dtype)
        self.limits: ResolvedLimits = resolve_limits(config, self.arch, self.dtype, self.device,
                                                     self.kv_dtype)
        kv_cache = allocate_kv_cache(self.arch, self.limits.num_gpu_blocks, config.block_size,
                                     self.kv_dtype, self.device)
        # a float8 cache's scales [L, 2, Hkv], fixed before any block is written
        kv_scales = kv_cache_scales(self.kv_dtype, self.arch, loaded.kv_scales, self.device)
        self.runner = ModelRunner(
            loaded.model, kv_cache,
            _attention_backend(config.attention_backend, self.device, self.kv_dtype),
            config.block_size, self.device, config.seed, kv_scales)
        # after the KV cache exists; CPU / torch backend: decode stays unpadded
        self.runner.setup_padded_decode(self.limits.max_model_len, config.max_num_seqs,
                                        capture=not config.enforce_eager)
        # the KV blocks' shape, dtype and scales: names the model for the prefix cache (and a
        # persistent store, see model_salt) and shapes the tier's records
        self.kv_geometry = geometry_of(kv_cache, scale_digest(kv_scales))
        self.model_salt = model_salt(config.model, config.seed, self.arch, self.kv_geometry)
        self.kv_manager = KVCacheManager(
            self.limits.num_gpu_blocks, config.block_size,
            salt=self.model_salt if config.enable_prefix_caching else None)
        self.tier = _build_tier(config, self.kv_geometry, kv_cache.device, device_share)
        self.preemption = PreemptionPolicy(config.preemption_mode,
                                           self.tier.geometry.block_bytes if self.tier else 0)
        self.scheduler = Scheduler(
            SchedulerLimits(config.max_num_seqs, self.limits.max_num_batched_tokens,
                            self.limits.max_model_len, config.enable_chunked_prefill),
            self.kv_manager, self.preemption, self.tier)
        self.swaps = SwapTracker(self.scheduler, self.preemption,
                                 KVSwapper(self.tier, kv_cache) if self.tier else None)
        self._requests: dict[str, _Request] = {}
        self._arrivals = itertools.count()
        self._eos = frozenset(self.tokenizer.eos_token_ids if self.tokenizer
                              else self.arch.eos_token_ids)
        self.num_steps = 0
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0

    @classmethod
    def from_options(cls, model: str | None = None, **options) -> "LLMEngine":
        return cls(EngineConfig.from_options(model, **options))

    # ---- requests -------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """Validate a prompt and return its token ids (clear ValueErrors for bad input)."""
        return tokenize_prompt(prompt, self.tokenizer, self.arch.vocab_size,
                               self.limits.max_model_len, self.model_name)

    def check_sampling_params(self, params: SamplingParams) -> SamplingParams:
        """ValueError unless ``params`` is a SamplingParams that fits this model's vocabulary."""
        return check_sampling_params(params, self.arch.vocab_size)

    def add_request(self, request_id: str, prompt: str | list[int],
                    sampling_params: SamplingParams | None = None, *,
                    prompt_ids: list[int] | None = None) -> None:
        """Queue a request. ``prompt_ids``: what ``tokenize_prompt(prompt)`` returned, for a
        caller that tokenized first (it is not tokenized and checked again)."""
        if request_id in self._requests or self.scheduler.is_tracking(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        params = self.check_sampling_params(sampling_params or SamplingParams())
        ids = self.tokenize_prompt(prompt) if prompt_ids is None else prompt_ids
        seq = Sequence(request_id, ids, params, self._eos, next(self._arrivals))
        self.scheduler.add(seq)
        detok = (IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens, params.stop)
                 if self.tokenizer else None)
        self._requests[request_id] = _Request(seq, prompt if isinstance(prompt, str) else None,
                                              detok)
        self.num_prompt_tokens += len(ids)

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            req = self._requests.pop(rid, None)
            if req is not None:
                self.scheduler.finish(req.seq, SequenceStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        """True while a request is unfinished or swap I/O (of aborted requests too) is pending;
        ``step()`` completes that I/O and releases its blocks."""
        return bool(self._requests) or bool(self.swaps.num_pending)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- stepping -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; return an output for every request that advanced or finished.

        Schedule (with the swaps that finished or start now, see ``SwapTracker``), execute the
        batch on the device, then update the sequences with what was sampled."""
        out = self.swaps.schedule()
        sampled = self._execute(out)
        return self._update(out, sampled)

    def _execute(self, out: SchedulerOutput) -> SamplerOutput:
        t0 = time.perf_counter()
        sampled = self.runner.execute(out)
        if out.num_prefill_tokens:
            self.preemption.prefill_speed.add(out.num_prefill_tokens, time.perf_counter() - t0)
        self.num_steps += 1
        return sampled

    def _update(self, out: SchedulerOutput, sampled: SamplerOutput) -> list[RequestOutput]:
        seqs = {w.request_id: self._requests[w.request_id].seq for w in out.scheduled}
        updated = self.scheduler.update(out, sampled, seqs)
        self.num_generated_tokens += len(updated)
        results = []
        for seq in updated:
            req = self._requests[seq.request_id]
            if req.detokenizer and req.detokenizer.update(seq.output_token_ids):
                self.scheduler.finish(seq, SequenceStatus.FINISHED_STOPPED)
            results.append(self._output(req))
            if seq.status.is_finished:
                del self._requests[seq.request_id]
        return results

    def close(self) -> None:
        """Abort what is left, wait for I/O in flight and release the swap tier."""
        self.abort_request(list(self._requests))
        self.swaps.drain()
        if self.tier is not None:
            self.tier.close()

    def _output(self, req: _Request) -> RequestOutput:
        seq = req.seq
        text = req.detokenizer.text if req.detokenizer else ""
        completion = CompletionOutput(0, text, list(seq.output_token_ids), seq.finish_reason)
        return RequestOutput(seq.request_id, req.prompt, seq.prompt_token_ids, [completion],
                             seq.status.is_finished, seq.num_cached_tokens)

    def stats(self) -> dict[str, float | int]:
        sched = self.scheduler
        return {
            "steps": self.num_steps,
            "graph_decode_steps": self.runner.num_graph_decode_steps,
            "prompt_tokens": self.num_prompt_tokens,
            "generation_tokens": self.num_generated_tokens,
            "preemptions": sched.num_preemptions,
            "recomputed_sequences": sched.num_recomputed_sequences,
            "swap_failures": sched.num_swap_failures,
            "swap_out_blocks": sched.swap_out_blocks,
            "swap_in_blocks": sched.swap_in_blocks,
            "prefix_cache_queries": sched.prefix_cache_queries,
            "prefix_cache_hits": sched.prefix_cache_hits,
            **self.swaps.stats(),
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "swapped": len(sched.swapped) + len(sched.swapping_out) + len(sched.swapping_in),
            "gpu_blocks_free": self.kv_manager.num_free_blocks,
            "gpu_blocks_total": self.kv_manager.num_total_blocks,
            "gpu_blocks_cached": self.kv_manager.num_cached_free_blocks,
            "tier_blocks_used": sched.tier_blocks_used,
            "tier_blocks_total": self.tier.num_blocks if self.tier else 0,
        }


def _build_tier(config: EngineConfig, geometry: KVGeometry, device: torch.device,
                device_share: DeviceShare | None):
    if not config.tier.enabled:
        return None
    from hifc.tiers import make_tier
    return make_tier(config.tier, geometry, device=device, device_share=device_share)
