"""Engine configuration: frozen, validated at construction, never written back.

Option names follow vLLM where one exists. Values that depend on the loaded model or the device
(the KV pool size, the resolved max_model_len, ...) are computed at start-up and returned in a
separate object (see ``hifc.engine.limits``), never stored here.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

DTYPES = ("auto", "float32", "float16", "bfloat16")
BLOCK_SIZES = (16, 32, 64, 128, 256)
ATTENTION_BACKENDS = ("auto", "torch", "triton")


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

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model must be a non-empty string (path, alias or random:<preset>)")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
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
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise ValueError(f"kv_cache_gib must be positive, got {self.kv_cache_gib!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.num_gpu_blocks is not None and self.kv_cache_gib is not None:
            raise ValueError("give either num_gpu_blocks or kv_cache_gib, not both")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.max_num_batched_tokens is not None:
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                    f"max_num_seqs ({self.max_num_seqs})")
            if self.max_model_len is not None and self.max_num_batched_tokens < self.max_model_len:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                    f"max_model_len ({self.max_model_len}): prompts are prefilled in one step")

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
