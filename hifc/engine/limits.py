"""Resolves the values that depend on the model and device: device, dtype, KV pool, lengths."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hifc.config import EngineConfig
from hifc.dtypes import FP8_E4M3, torch_dtype
from hifc.models.config import ModelArchConfig
from hifc.models.registry import activation_bytes_per_token, size_estimate
from hifc.runtime.kv_cache import kv_bytes_per_block

logger = logging.getLogger(__name__)

CPU_DEFAULT_KV_GIB = 1.0
_GIB = 1 << 30
DEFAULT_BATCHED_TOKENS = 8192
# vLLM's step budget for its LLM class on GPUs of LARGE_GPU_BYTES or more (A100s excepted, where
# it measured lower throughput); its server keeps 8,192 there. 8B preset on H100s against 8,192:
# GovReport-like 0.4-0.6% more out tok/s; 32 x 1,024 in, 128 out, 0.5% more on one machine and
# 0.4% less on another, on average (docs/RESULTS.md)
LARGE_GPU_BATCHED_TOKENS = 16384
LARGE_GPU_BYTES = 70 * _GIB


class KVPoolTooLarge(ValueError):
    """An explicit KV pool that does not fit the device's free memory."""


class StepTooLarge(KVPoolTooLarge):
    """An explicit KV pool that fits, but leaves too little memory for one step of
    max_num_batched_tokens tokens."""


@dataclass(frozen=True)
class ResolvedLimits:
    num_gpu_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    block_bytes: int  # one block id across all layers, K and V


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {config.device!r} requested but CUDA is not available")
    return torch.device(config.device)


def resolve_dtype(config: EngineConfig, device: torch.device) -> torch.dtype:
    if config.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch_dtype(config.dtype)


def resolve_kv_dtype(config: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type: the model's (auto) or float8_e4m3fn (fp8, fp8_e4m3)."""
    return dtype if config.kv_cache_dtype == "auto" else torch_dtype(FP8_E4M3)


def _activation_reserve_bytes(per_token: int, vocab_size: int, num_tokens: int,
                              max_num_seqs: int) -> int:
    """Upper estimate of a step's activation memory: the widest live tensors per token (the
    registry's estimate for the architecture), float32 logits and their copies, and slack."""
    logits = max_num_seqs * vocab_size * 4 * 3
    return int(1.5 * num_tokens * per_token) + logits + 512 * (1 << 20)


def resolve_limits(config: EngineConfig, arch: ModelArchConfig, dtype: torch.dtype,
                   device: torch.device, kv_dtype: torch.dtype | None = None) -> ResolvedLimits:
    """dtype: the model's; kv_dtype: the KV cache's (default: the model's)."""
    block_bytes = kv_bytes_per_block(arch, config.block_size, kv_dtype or dtype)
    model_len = arch.max_position_embeddings
    if config.max_model_len is not None:
        if config.max_model_len > model_len:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's context "
                             f"length {model_len}")
        model_len = config.max_model_len

    if config.num_gpu_blocks is not None:
        num_blocks = config.num_gpu_blocks
    elif config.kv_cache_gib is not None:
        num_blocks = int(config.kv_cache_gib * _GIB // block_bytes)
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        batch_tokens = _batched_tokens(config, model_len, device)
        size = size_estimate(arch, dtype)
        reserve = _activation_reserve_bytes(size.activation_bytes_per_token, arch.vocab_size,
                                            batch_tokens, config.max_num_seqs)
        budget = total * config.gpu_memory_utilization - (total - free) - reserve
        num_blocks = int(budget // block_bytes)
        logger.info("KV budget: %.1f GiB (weights %.1f GiB, activation reserve %.1f GiB)",
                    max(budget, 0) / _GIB, size.parameter_bytes / _GIB, reserve / _GIB)
    else:
        num_blocks = int(CPU_DEFAULT_KV_GIB * _GIB // block_bytes)
    if num_blocks < 1:
        raise ValueError(f"the KV cache budget holds no block of {block_bytes} bytes; "
                         "raise kv_cache_gib / num_gpu_blocks / gpu_memory_utilization")

    capacity = num_blocks * config.block_size
    if model_len > capacity:
        if config.max_model_len is not None:
            raise ValueError(f"max_model_len {config.max_model_len} needs more KV cache than the "
                             f"pool holds ({num_blocks} blocks x {config.block_size} tokens = "
                             f"{capacity} tokens)")
        model_len = capacity
        logger.info("max_model_len capped to the KV pool capacity: %d tokens", capacity)
    batched = _batched_tokens(config, model_len, device)
    if batched < model_len and not config.enable_chunked_prefill:
        raise ValueError(f"max_num_batched_tokens ({batched}) must be at least max_model_len "
                         f"({model_len}) without chunked prefill: prompts are prefilled in one "
                         "step")
    if 0 < config.prefill_attention_budget < model_len:
        raise ValueError(f"prefill_attention_budget ({config.prefill_attention_budget}) must be 0 "
                         f"or at least max_model_len ({model_len}): one token at the end of the "
                         "longest sequence attends over that many keys")
    if device.type == "cuda" and config.kv_pool_given:
        reserve = _activation_reserve_bytes(activation_bytes_per_token(arch, dtype),
                                            arch.vocab_size, batched, config.max_num_seqs)
        _check_pool_fits(num_blocks, block_bytes, reserve, batched, device)
    return ResolvedLimits(num_blocks, model_len, batched, block_bytes)


def _check_pool_fits(num_blocks: int, block_bytes: int, reserve: int, batched: int,
                     device: torch.device) -> None:
    """An explicit KV pool (num_gpu_blocks / kv_cache_gib) must fit the device's free memory
    (the model's weights are loaded by now) with room beside it for one step of ``batched``
    tokens (``reserve``: the same activation estimate that sizes a pool from
    gpu_memory_utilization): else a clear error instead of the allocator's, then or at the first
    long step. Free: the device's, plus what torch's allocator holds unused (it serves the pool
    too)."""
    free = (torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
            - torch.cuda.memory_allocated(device))
    need = num_blocks * block_bytes
    pool = f"a KV cache of {num_blocks} blocks ({need / _GIB:.1f} GiB)"
    if need > free:
        raise KVPoolTooLarge(f"{pool} does not fit the {free / _GIB:.1f} GiB free on {device} "
                             "after the model's weights: lower num_gpu_blocks / kv_cache_gib")
    if need + reserve > free:
        raise StepTooLarge(f"{pool} leaves {(free - need) / _GIB:.1f} GiB free on {device} "
                           f"beside the model's weights, and a step of {batched} tokens may need "
                           f"{reserve / _GIB:.1f} GiB for its activations: lower num_gpu_blocks / "
                           "kv_cache_gib or max_num_batched_tokens")


def _batched_tokens(config: EngineConfig, model_len: int, device: torch.device) -> int:
    """The step's token budget: a long prompt is split into chunks of it (chunked prefill) or
    must fit it whole."""
    if config.max_num_batched_tokens is not None:
        return config.max_num_batched_tokens
    if config.enable_chunked_prefill:
        return max(chunked_default(config.usage_context, device), config.max_num_seqs)
    return max(DEFAULT_BATCHED_TOKENS, model_len)


def chunked_default(usage_context: str, device: torch.device) -> int:
    """The step's token budget with chunked prefill unless one is given: vLLM's, by usage
    context and GPU (hifc keeps 8,192 wherever vLLM's is smaller)."""
    if usage_context == "llm" and device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        if props.total_memory >= LARGE_GPU_BYTES and "a100" not in props.name.lower():
            return LARGE_GPU_BATCHED_TOKENS
    return DEFAULT_BATCHED_TOKENS
