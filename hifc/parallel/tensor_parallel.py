"""Tensor parallelism for one engine: ``start_tensor_parallel``.

``tensor_parallel_size`` N > 1 splits the model Megatron-style over N processes, one per GPU
(:mod:`hifc.layers.tensor_parallel`): the engine's process is rank 0 and keeps the scheduler, the
sampler and the tier's block space; ranks 1..N-1 (:mod:`hifc.parallel.tp_worker`) hold their
parts of the model and of the KV cache and follow the steps rank 0 sends them
(:mod:`hifc.parallel.tp_driver`, :mod:`hifc.parallel.tp_control`). Every rank moves its own KV
shard to and from the swap tier, in a cache file of its own (:mod:`hifc.parallel.tp_launch`).
"""
from __future__ import annotations

import torch

from hifc.config import EngineConfig
from hifc.layers.tensor_parallel import check_divides
from hifc.loader import model_arch
from hifc.parallel.tp_driver import TPDriver
from hifc.parallel.tp_launch import Rendezvous, launched_rank


def start_tensor_parallel(config: EngineConfig, device: torch.device) -> TPDriver | None:
    """Rank 0's driver of the workers (None with one rank). A model whose heads or MLP width
    do not divide is refused before any process starts. Under a launcher, a process of rank
    r > 0 runs as a worker until the engine closes and then leaves (SystemExit)."""
    size = config.parallel.tensor_parallel_size
    if size == 1:
        return None
    check_divides(model_arch(config.model, config.hf_overrides), size)
    rank = launched_rank(size)
    if rank:
        from hifc.parallel.tp_worker import run_worker

        run_worker(config, rank, Rendezvous("env://", size), device, True)
        raise SystemExit(0)
    return TPDriver.start(config, device)
