"""Engine configuration: frozen, validated at construction, never written back.

Option names follow vLLM where one exists; each is declared once (``hifc.options.option``) and
the flat keyword options and the command-line flags are made from those declarations. The swap
tier's options are a nested ``TierConfig``, the replicas' and GPUs' a nested ``ParallelConfig``.
Values that depend on the loaded model or the device (the KV pool size, the resolved
max_model_len, ...) are computed at start-up and returned in a separate object (see
``hifc.engine.limits``), never stored here.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from hifc import dtypes
from hifc.core.preemption import PREEMPTION_MODES
from hifc.options import (add_config_args, build, canonical_json_object, check_choice,
                          check_size_gib, flatten, option, options_from_args)
from hifc.parallel.config import ParallelConfig, check_replicas
from hifc.tiers.config import TierConfig

DTYPES = ("auto",) + dtypes.NAMES + tuple(dtypes.ALIASES)
# auto: the model's dtype; fp8 (alias fp8_e4m3): float8_e4m3fn with per-layer or per-head scales
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
BLOCK_SIZES = (16, 32, 64, 128, 256)
ATTENTION_BACKENDS = ("auto", "torch", "triton")
DEFAULT_MODEL = "smollm2-135m"
USAGE_CONTEXTS = ("llm", "server")


@dataclass(frozen=True)
class EngineConfig:
    """Engine."""

    model: str = option(
        DEFAULT_MODEL, "Hugging Face model directory, .gguf file, alias (smollm2-135m) or "
        "random:<preset>")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    dtype: str = option(
        "auto", "weights and KV cache; auto: bfloat16 on CUDA, float32 on CPU (half = float16, "
        "float = float32)", choices=DTYPES)
    kv_cache_dtype: str = option(
        "auto", "KV cache element type; auto: the model's dtype; fp8 (alias fp8_e4m3): "
        "float8_e4m3fn scaled per layer or head (the checkpoint's k_scale/v_scale, else 1.0), "
        "twice the tokens per GiB and half the bytes per swap", choices=KV_CACHE_DTYPES)
    block_size: int = option(64, "tokens per KV block", choices=BLOCK_SIZES)
    max_model_len: int | None = option(
        None, "longest sequence (default: the model's context, capped by the KV pool)")
    max_num_seqs: int = option(256, "most sequences in one batch")
    max_num_batched_tokens: int | None = option(
        None, "most tokens in one step (default with chunked prefill: 16384 outside a server on "
        "a GPU of 70 GiB or more other than an A100, as vLLM's LLM class, else 8192, and at "
        "least max_num_seqs; without it: max(8192, max_model_len))")
    num_gpu_blocks: int | None = option(None, "explicit KV pool size in blocks (also on CPU)")
    kv_cache_gib: float | None = option(None, "KV pool budget in GiB")
    gpu_memory_utilization: float = option(
        0.9, "fraction of GPU memory for weights, activations and KV")
    hf_overrides: str | None = option(
        None, "model config values to set before the model is built, as vLLM's "
        "hf_overrides: a JSON object (or a dict) of ModelArchConfig fields, which are the "
        "Hugging Face config keys, e.g. '{\"num_hidden_layers\": 2}' for the first 2 layers "
        "(the checkpoint's later layers are not loaded)")
    seed: int = option(0, "seed of the random weights and of unseeded sampling")
    attention_backend: str = option(
        "auto", "auto: triton on CUDA, torch elsewhere", choices=ATTENTION_BACKENDS)
    enforce_eager: bool = option(
        False, "run every step eagerly (no CUDA graphs of decode steps)")
    tune_gemms: bool = option(
        True, "on CUDA, time at start-up torch's cuBLAS and cuBLASLt kernels and cuBLASLt's "
        "other candidates for each projection shape, at the decode batch sizes and by powers "
        "of two up to max_num_batched_tokens, and run each product through the fastest")
    async_scheduling: bool | None = option(
        None, "schedule and launch step N+1 while the device runs step N, and apply step N's "
        "tokens (stop checks, detokenizing, outputs) while step N+1 runs: the same outputs, "
        "host time hidden behind device time (default: on with CUDA, off on the CPU and with "
        "tensor parallelism). Where step N sampled for structured outputs or bad words, step "
        "N is applied while step N+1's forward runs, before its sampling (the masks depend "
        "on step N's tokens)")
    max_logprobs: int = option(
        20, "most log-probabilities a request may ask for per token (logprobs, prompt_logprobs)")
    enable_prefix_caching: bool = option(
        True, "share the KV blocks of common prompt prefixes between requests (GPU prefix cache)")
    enable_chunked_prefill: bool = option(
        True, "prefill long prompts in chunks that share each step's token budget with the "
        "decoding sequences")
    long_prefill_token_threshold: int = option(
        0, "with chunked prefill, the most tokens one sequence prefills in a step (0: no cap "
        "beyond max_num_batched_tokens): a long prompt spreads over more, shorter steps, so "
        "the sequences decoding beside it keep a short time per output token. At most 256: "
        "with CUDA graphs, a step of decodes beside one such chunk replays a graph too "
        "(captured per decode batch size at start-up)")
    prefill_attention_budget: int = option(
        0, "with chunked prefill, the most query-key pairs the prompt chunks of one step attend "
        "over, summed (0: no limit; else at least max_model_len): a chunk of n tokens after c "
        "computed ones attends over n*c + n*(n+1)/2 pairs, so chunks shrink as a long prompt "
        "advances and each step's attention work stays within the budget, keeping the time "
        "per output token of the sequences decoding beside it even")
    preemption: str | None = option(
        None, "recompute, swap or auto (default: swap when a tier is set)",
        choices=PREEMPTION_MODES)
    cpu_threads: int | None = option(
        None, "torch CPU threads (default on CPU: usable cores - 1, unless OMP_NUM_THREADS is "
        "set)")
    usage_context: str = option(
        "llm", "who runs the engine (vLLM's usage context): llm (the LLM class, hifc generate, "
        "the benchmarks) or server (hifc serve); it sets max_num_batched_tokens' default",
        choices=USAGE_CONTEXTS, cli=False)
    tier: TierConfig = field(default_factory=TierConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string (path, alias or random:<preset>)")
        if not isinstance(self.device, str) or not (
                self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        object.__setattr__(self, "hf_overrides",
                           canonical_json_object("hf_overrides", self.hf_overrides))
        check_choice("dtype", self.dtype, DTYPES)
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype))  # half -> float16
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        check_choice("block_size", self.block_size, BLOCK_SIZES)
        check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        check_choice("usage_context", self.usage_context, USAGE_CONTEXTS)
        _positive_int("max_num_seqs", self.max_num_seqs)
        _non_negative_int("max_logprobs", self.max_logprobs)
        for name in ("max_model_len", "max_num_batched_tokens", "num_gpu_blocks"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.kv_cache_gib is not None:
            check_size_gib("kv_cache_gib", self.kv_cache_gib)
        if isinstance(self.gpu_memory_utilization, bool) \
                or not isinstance(self.gpu_memory_utilization, (int, float)) \
                or not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.num_gpu_blocks is not None and self.kv_cache_gib is not None:
            raise ValueError("give either num_gpu_blocks or kv_cache_gib, not both")
        for name in ("enforce_eager", "tune_gemms", "enable_prefix_caching",
                     "enable_chunked_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("long_prefill_token_threshold", "prefill_attention_budget"):
            _non_negative_int(name, getattr(self, name))
            if getattr(self, name) and not self.enable_chunked_prefill:
                raise ValueError(f"{name} needs enable_chunked_prefill: without it a prompt is "
                                 "prefilled in one step")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise ValueError(f"async_scheduling must be True, False or None (auto), "
                             f"got {self.async_scheduling!r}")
        if self.async_scheduling and self.parallel.tensor_parallel_size > 1:
            raise ValueError("async_scheduling is not supported with tensor_parallel_size > 1 "
                             "(the other ranks would need the pending tokens)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) \
                or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.cpu_threads is not None:
            _positive_int("cpu_threads", self.cpu_threads)
        if not isinstance(self.tier, TierConfig):
            raise ValueError("tier must be a TierConfig")
        if not isinstance(self.parallel, ParallelConfig):
            raise ValueError("parallel must be a ParallelConfig")
        check_replicas(self)
        if self.preemption is not None:
            check_choice("preemption", self.preemption, PREEMPTION_MODES)
        if not self.tier.enabled and self.preemption in ("swap", "auto"):
            raise ValueError(f"preemption={self.preemption!r} needs a swap tier: set kv_offload "
                             "to dram or flash")
        if self.max_num_batched_tokens is not None:
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                    f"max_num_seqs ({self.max_num_seqs})")
            if (not self.enable_chunked_prefill and self.max_model_len is not None
                    and self.max_num_batched_tokens < self.max_model_len):
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                    f"max_model_len ({self.max_model_len}) without chunked prefill: prompts are "
                    "prefilled in one step")

    @property
    def kv_pool_given(self) -> bool:
        """Whether the KV pool's size is given (num_gpu_blocks or kv_cache_gib) rather than
        taken from the device's free memory."""
        return self.num_gpu_blocks is not None or self.kv_cache_gib is not None

    @property
    def preemption_mode(self) -> str:
        """The preemption mode in effect: swap when a tier is configured, unless told otherwise."""
        if self.preemption is not None:
            return self.preemption
        return "swap" if self.tier.enabled else "recompute"

    @classmethod
    def from_options(cls, model: str | None = None, **options) -> "EngineConfig":
        """Build from flat keyword options (``kv_offload="flash"`` goes to the tier config),
        rejecting unknown names with the list of valid ones."""
        if model is not None:
            options["model"] = model
        return build(cls, options)

    def options(self) -> dict:
        """The flat keyword options that ``from_options`` turns back into this config."""
        return flatten(self)


def add_engine_args(parser: argparse.ArgumentParser, **defaults) -> None:
    """The engine's flags (``--block-size``, ``--kv-offload``, ...), one per option;
    ``defaults`` replaces some defaults (a benchmark's ``model``)."""
    add_config_args(parser, EngineConfig, title="engine", defaults=defaults)


def named_with_overrides(model: str, hf_overrides: str | None) -> str:
    """``model`` as a report names it: with its ``hf_overrides``, if any."""
    return f"{model} (hf_overrides {hf_overrides})" if hf_overrides else model


def engine_config_from_args(args: argparse.Namespace, **fixed) -> EngineConfig:
    """The config of the engine flags in ``args``, with ``fixed`` options (the server's
    ``usage_context``) that have no flag."""
    return EngineConfig.from_options(**options_from_args(args, EngineConfig), **fixed)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _non_negative_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
