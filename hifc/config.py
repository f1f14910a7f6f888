"""Engine configuration: frozen, validated at construction, never written back.

Option names follow vLLM where one exists. Values that depend on the loaded model or the device
(the KV pool size, the resolved max_model_len, ...) are computed at start-up and returned in a
separate object (see ``hifc.engine.limits``), never stored here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

DTYPES = ("auto", "float32", "float16", "bfloat16")
BLOCK_SIZES = (16, 32, 64, 128, 256)
ATTENTION_BACKENDS = ("auto", "torch", "triton")
KV_OFFLOAD = ("none", "dram", "flash")
FLASH_POLICIES = ("append", "left-append")
FLASH_BACKENDS = ("auto", "kvikio", "posix")
PREEMPTION = ("recompute", "swap", "auto")
MAX_GIB = 1 << 20  # sizes in GiB above 1 PiB are typos, and past float range is inf


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto = bfloat16 on CUDA, float32 on CPU
    block_size: int = 64
    max_model_len: int | None = None  # default: the model's context, capped by the KV pool
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: max(8192, max_model_len)
    num_gpu_blocks: int | None = None  # explicit KV pool size (also on CPU)
    kv_cache_gib: float | None = None  # KV pool budget in GiB
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory for weights + activations + KV
    seed: int = 0
    attention_backend: str = "auto"  # auto = triton on CUDA, torch elsewhere
    enforce_eager: bool = False  # True: no CUDA graphs (otherwise decode steps replay graphs)
    # Where preempted sequences' KV goes (HiFC): nowhere (recompute), pinned DRAM, or flash.
    kv_offload: str = "none"
    flash_path: str | None = None  # cache file of the flash tier (created preallocated)
    flash_size_gib: float | None = None  # size of the flash tier
    flash_policy: str = "append"  # append (sequential log) | left-append (lowest free block)
    flash_io_threads: int = 8
    flash_backend: str = "auto"  # auto: kvikio where GPUDirect Storage works, else posix
    swap_space: float | None = None  # GiB of pinned DRAM for kv_offload="dram" (vLLM's name)
    preemption: str | None = None  # recompute | swap | auto; default: swap with a tier
    tier_fault_injection: bool = False  # tests: expose engine.tier.faults
    cpu_threads: int | None = None  # torch CPU threads; default: usable cores - 1 (see threads)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string (path, alias or random:<preset>)")
        if not isinstance(self.device, str) or not (
                self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(
                f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {self.block_size!r}")
        _positive_int("max_num_seqs", self.max_num_seqs)
        for name in ("max_model_len", "max_num_batched_tokens", "num_gpu_blocks"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        for name in ("kv_cache_gib", "flash_size_gib", "swap_space"):
            if getattr(self, name) is not None:
                _size_gib(name, getattr(self, name))
        if isinstance(self.gpu_memory_utilization, bool) \
                or not isinstance(self.gpu_memory_utilization, (int, float)) \
                or not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.num_gpu_blocks is not None and self.kv_cache_gib is not None:
            raise ValueError("give either num_gpu_blocks or kv_cache_gib, not both")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        self._validate_offload()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) \
                or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.cpu_threads is not None:
            _positive_int("cpu_threads", self.cpu_threads)
        if self.max_num_batched_tokens is not None:
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                    f"max_num_seqs ({self.max_num_seqs})")
            if self.max_model_len is not None and self.max_num_batched_tokens < self.max_model_len:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                    f"max_model_len ({self.max_model_len}): prompts are prefilled in one step")

    def _validate_offload(self) -> None:
        if self.kv_offload not in KV_OFFLOAD:
            raise ValueError(f"kv_offload must be one of {', '.join(KV_OFFLOAD)}, "
                             f"got {self.kv_offload!r}")
        if self.flash_backend not in FLASH_BACKENDS:
            raise ValueError(f"flash_backend must be one of {', '.join(FLASH_BACKENDS)}, "
                             f"got {self.flash_backend!r}")
        if self.flash_policy not in FLASH_POLICIES:
            raise ValueError(f"flash_policy must be one of {', '.join(FLASH_POLICIES)}, "
                             f"got {self.flash_policy!r}")
        if self.preemption is not None and self.preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {', '.join(PREEMPTION)}, "
                             f"got {self.preemption!r}")
        if self.kv_offload == "none" and self.preemption in ("swap", "auto"):
            raise ValueError(f"preemption={self.preemption!r} needs a swap tier: set kv_offload "
                             "to dram or flash")
        if self.flash_path is not None and not isinstance(self.flash_path, (str, os.PathLike)):
            raise ValueError(f"flash_path must be a path, got {type(self.flash_path).__name__}")
        if self.kv_offload == "flash":
            if not self.flash_path:
                raise ValueError("kv_offload='flash' needs flash_path (the cache file to create)")
            if self.flash_size_gib is None or not self.flash_size_gib > 0:
                raise ValueError("kv_offload='flash' needs a positive flash_size_gib")
        if self.kv_offload == "dram" and (self.swap_space is None or not self.swap_space > 0):
            raise ValueError("kv_offload='dram' needs a positive swap_space (GiB)")
        _positive_int("flash_io_threads", self.flash_io_threads)

    @property
    def preemption_mode(self) -> str:
        """The preemption mode in effect: swap when a tier is configured, unless told otherwise."""
        if self.preemption is not None:
            return self.preemption
        return "recompute" if self.kv_offload == "none" else "swap"

    @classmethod
    def from_options(cls, model: str | None = None, **options) -> "EngineConfig":
        """Build from keyword options, rejecting unknown names with the list of valid ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {', '.join(unknown)}; "
                            f"valid options: {', '.join(sorted(known - {'model'}))}")
        if model is not None:
            options["model"] = model
        return cls(**options)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _size_gib(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_GIB:  # also false for nan
        raise ValueError(f"{name} must be a number of GiB in (0, {MAX_GIB}], got {value!r}")
