"""Engine options on the command line (shared by generate, serve and the benchmarks)."""
from __future__ import annotations

import argparse

from hifc.config import (ATTENTION_BACKENDS, BLOCK_SIZES, DTYPES, FLASH_BACKENDS,
                         FLASH_POLICIES, KV_OFFLOAD, PREEMPTION, EngineConfig)


def add_engine_args(parser: argparse.ArgumentParser, model_default: str = "smollm2-135m") -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=model_default,
                   help="HF model directory, .gguf file, alias (smollm2-135m) or random:<preset>")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--dtype", default="auto", choices=DTYPES)
    g.add_argument("--block-size", type=int, default=64, choices=BLOCK_SIZES)
    g.add_argument("--max-model-len", type=int)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int)
    g.add_argument("--num-gpu-blocks", type=int, help="explicit KV pool size in blocks")
    g.add_argument("--kv-cache-gib", type=float, help="KV pool budget in GiB")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    g.add_argument("--enforce-eager", action="store_true",
                   help="run every step eagerly (no CUDA graphs of decode steps)")
    g.add_argument("--cpu-threads", type=int,
                   help="torch CPU threads (default on CPU: usable cores - 1, unless "
                        "OMP_NUM_THREADS is set)")
    t = parser.add_argument_group("KV swap tier")
    t.add_argument("--kv-offload", default="none", choices=KV_OFFLOAD,
                   help="where preempted sequences' KV goes")
    t.add_argument("--flash-path", help="flash tier cache file (created preallocated, mode 0600)")
    t.add_argument("--flash-size-gib", type=float, help="flash tier size in GiB")
    t.add_argument("--flash-policy", default="append", choices=FLASH_POLICIES)
    t.add_argument("--flash-io-threads", type=int, default=8)
    t.add_argument("--flash-backend", default="auto", choices=FLASH_BACKENDS,
                   help="flash tier I/O: kvikio (cuFile) or posix O_DIRECT; auto: kvikio where "
                        "GPUDirect Storage works, else posix")
    t.add_argument("--swap-space", type=float, help="pinned DRAM tier size in GiB (--kv-offload dram)")
    t.add_argument("--preemption", choices=PREEMPTION,
                   help="recompute, swap or auto (default: swap when a tier is set)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, block_size=args.block_size,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, num_gpu_blocks=args.num_gpu_blocks,
        kv_cache_gib=args.kv_cache_gib, gpu_memory_utilization=args.gpu_memory_utilization,
        seed=args.seed, attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager, kv_offload=args.kv_offload,
        flash_path=args.flash_path, flash_size_gib=args.flash_size_gib,
        flash_policy=args.flash_policy, flash_io_threads=args.flash_io_threads,
        flash_backend=args.flash_backend, swap_space=args.swap_space, preemption=args.preemption,
        cpu_threads=args.cpu_threads)
