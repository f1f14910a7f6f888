"""LLMEngine: add requests, step, abort. Single-threaded; the caller drives ``step()``."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from hifc.config import EngineConfig
from hifc.core.kv_manager import KVCacheManager
from hifc.core.scheduler import Scheduler, SchedulerLimits
from hifc.core.sequence import Sequence, SequenceStatus
from hifc.engine.detokenizer import IncrementalDetokenizer
from hifc.engine.limits import ResolvedLimits, resolve_device, resolve_dtype, resolve_limits
from hifc.engine.outputs import CompletionOutput, RequestOutput
from hifc.layers.attention import AttentionBackend, TorchAttentionBackend
from hifc.loader import LoadedModel, load_model
from hifc.runtime.kv_cache import allocate_kv_cache
from hifc.runtime.model_runner import ModelRunner
from hifc.sampling_params import SamplingParams


@dataclass
class _Request:
    seq: Sequence
    prompt: str | None
    detokenizer: IncrementalDetokenizer | None


def _attention_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if device.type != "cuda":
        raise ValueError("attention_backend 'triton' needs a CUDA device")
    from hifc.layers.triton_attention import TritonAttentionBackend
    return TritonAttentionBackend()


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = resolve_device(config)
        self.dtype = resolve_dtype(config, self.device)
        torch.manual_seed(config.seed)
        loaded: LoadedModel = load_model(config.model, self.dtype, self.device, config.seed)
        self.model_name = loaded.name
        self.arch = loaded.arch
        self.tokenizer = loaded.tokenizer
        self.limits: ResolvedLimits = resolve_limits(config, self.arch, self.dtype, self.device)
        kv_cache = allocate_kv_cache(self.arch, self.limits.num_gpu_blocks, config.block_size,
                                     self.dtype, self.device)
        self.runner = ModelRunner(loaded.model, kv_cache,
                                  _attention_backend(config.attention_backend, self.device),
                                  config.block_size, self.arch.head_dim, self.device, config.seed)
        self.kv_manager = KVCacheManager(self.limits.num_gpu_blocks, config.block_size)
        self.scheduler = Scheduler(
            SchedulerLimits(config.max_num_seqs, self.limits.max_num_batched_tokens,
                            self.limits.max_model_len), self.kv_manager)
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
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            if self.tokenizer is None:
                raise ValueError(f"model {self.model_name!r} has no tokenizer: pass token ids")
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
                raise ValueError("prompt token ids must be integers")
            bad = [t for t in ids if not 0 <= t < self.arch.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary "
                                 f"(0..{self.arch.vocab_size - 1})")
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got "
                             f"{type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt is empty")
        if len(ids) >= self.limits.max_model_len:
            raise ValueError(f"prompt is {len(ids)} tokens long; the maximum model length is "
                             f"{self.limits.max_model_len} (prompt plus at least one new token)")
        return ids

    def add_request(self, request_id: str, prompt: str | list[int],
                    sampling_params: SamplingParams | None = None) -> None:
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("sampling_params must be a SamplingParams")
        ids = self.tokenize_prompt(prompt)
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
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- stepping -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batch; return an output for every request that advanced or finished."""
        out = self.scheduler.schedule()
        sampled = self.runner.execute(out)
        self.num_steps += 1
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

    def _output(self, req: _Request) -> RequestOutput:
        seq = req.seq
        text = req.detokenizer.text if req.detokenizer else ""
        completion = CompletionOutput(0, text, list(seq.output_token_ids), seq.finish_reason)
        return RequestOutput(seq.request_id, req.prompt, seq.prompt_token_ids, [completion],
                             seq.status.is_finished)

    def stats(self) -> dict[str, float | int]:
        return {
            "steps": self.num_steps,
            "prompt_tokens": self.num_prompt_tokens,
            "generation_tokens": self.num_generated_tokens,
            "preemptions": self.scheduler.num_preemptions,
            "recomputed_sequences": self.scheduler.num_recomputed_sequences,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "gpu_blocks_free": self.kv_manager.num_free_blocks,
            "gpu_blocks_total": self.kv_manager.num_total_blocks,
        }
