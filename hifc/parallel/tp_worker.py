"""A tensor-parallel worker: rank r > 0 of an engine, in a process of its own.

It builds its part of the model (its heads, MLP features and vocabulary range), waits for rank
0's sizes, builds its KV shard ``[L, 2, NB, BS, Hkv / N, D]`` and runner (capturing the same
decode graphs as rank 0, the collectives inside), and its tier mover (its own cache file, said
in the superblock) when a tier is configured. Then it follows rank 0's commands
(:mod:`hifc.parallel.tp_control`): start tier orders on its shard, run each step's forward
pass, wait for a job, reply with the jobs that ended and the blocks staged, until told to
stop.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from hifc.config import EngineConfig
from hifc.engine.gc_heap import frozen_heap
from hifc.engine.limits import resolve_dtype, resolve_kv_dtype
from hifc.engine.threads import apply_cpu_threads
from hifc.loader import load_model
from hifc.parallel.tp_control import Command, ControlChannel, WorkerSetup
from hifc.parallel.tp_launch import (Rendezvous, control_group, join_group, rank_device,
                                     rank_tier_config, shard_arch, shard_scales)
from hifc.runtime.cuda_graphs import chunk_graph_tokens
from hifc.runtime.kv_cache import allocate_kv_cache, kv_cache_scales, scale_digest
from hifc.runtime.model_runner import ModelRunner
from hifc.tiers.factory import geometry_of, make_mover
from hifc.tiers.jobs import RankReport
from hifc.tiers.rank_jobs import RankJobs


def run_worker(config: EngineConfig, rank: int, rendezvous: Rendezvous,
               rank0_device: torch.device, launched: bool) -> None:
    """The worker process's whole life (spawned, or called under a launcher)."""
    from hifc.engine.llm_engine import attention_backend  # the engine imports this module

    device = rank_device(rank0_device, rank, launched)
    dtype = resolve_dtype(config, device)
    apply_cpu_threads(config.cpu_threads, device)
    torch.manual_seed(config.seed)
    shard = join_group(rendezvous, rank, device)
    channel = ControlChannel(rank, shard.size, control_group())
    try:
        loaded = load_model(config.model, dtype, device, config.seed, shard, config.hf_overrides)
        setup = channel.receive()
        if not isinstance(setup, WorkerSetup):
            return  # rank 0 stopped before it was built (its error is reported there)
        kv_dtype = resolve_kv_dtype(config, dtype)
        kv_arch = shard_arch(loaded.arch, shard.size)
        kv_cache = allocate_kv_cache(kv_arch, setup.num_gpu_blocks, config.block_size,
                                     kv_dtype, device)
        kv_scales = kv_cache_scales(kv_dtype, kv_arch, shard_scales(loaded.kv_scales, shard),
                                    device)
        runner = ModelRunner(loaded.model, kv_cache,
                             attention_backend(config.attention_backend, device, kv_dtype,
                                               loaded.arch.num_hidden_layers,
                                               setup.max_num_batched_tokens),
                             config.block_size, device, config.seed, kv_scales)
        runner.start_up(  # as rank 0's, whose passes' collectives these pair up with
            setup.max_model_len, config.max_num_seqs, setup.max_num_batched_tokens,
            tune=config.tune_gemms, capture=not config.enforce_eager,
            chunk_tokens=chunk_graph_tokens(config.long_prefill_token_threshold,
                                            setup.max_model_len))
        jobs = None
        if config.tier.enabled:
            mover = make_mover(rank_tier_config(config.tier, rank),
                               geometry_of(kv_cache, scale_digest(kv_scales)), device,
                               (rank, shard.size))
            jobs = RankJobs(rank, mover, kv_cache)
        with frozen_heap():
            _follow(channel, runner, jobs)
    finally:
        dist.destroy_process_group()


def _follow(channel: ControlChannel, runner: ModelRunner, jobs: RankJobs | None) -> None:
    """Apply rank 0's commands until it says stop."""
    while True:
        command: Command = channel.receive()
        for order in command.orders:
            jobs.start(order)
        if command.step is not None:
            runner.follow(command.step.scheduled, command.step.logprob_spans)
        if command.wait is not None:
            jobs.wait(*command.wait)
        if command.cancel_queued and jobs is not None:
            jobs.mover.cancel_queued()
        if command.reply:
            channel.answer(jobs.report() if jobs is not None else RankReport([], {}))
        if (command.close_tier or command.stop) and jobs is not None:
            jobs.close()
            jobs = None
        if command.stop:
            return
