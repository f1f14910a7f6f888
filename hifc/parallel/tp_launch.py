"""Where the ranks of a tensor-parallel engine come from, and what each one is given.

Two launches, one process per GPU either way:

* standalone: the engine's process is rank 0; it picks a free local port and spawns ranks
  1..N-1 (``torch.multiprocessing``, spawn) with the engine's config;
* under a torchrun-style launcher (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
  and ``LOCAL_RANK`` in the environment, ``WORLD_SIZE`` equal to ``tensor_parallel_size``):
  every process runs the same program; rank 0 builds the engine, the others become its workers
  when they reach the same ``LLMEngine(...)`` call and leave the process when it closes.

Rank r runs on ``cuda:(d + r)`` where rank 0's device is ``cuda:d`` (``cuda:LOCAL_RANK`` under a
launcher), or on the CPU. The model's collectives run on the default process group (NCCL on
GPUs, gloo on the CPU); the scheduler's messages on a second, gloo, group
(:mod:`hifc.parallel.tp_control`).
"""
from __future__ import annotations

import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from hifc.layers.tensor_parallel import TPShard
from hifc.models.config import ModelArchConfig
from hifc.ports import free_port
from hifc.tiers.config import TierConfig

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
RANK_FIELD = "{rank}"
TIMEOUT = datetime.timedelta(minutes=10)  # a rank that does not answer fails its peers then
# the workers wait for rank 0's next command as long as the engine idles (a dead rank 0 closes
# the connection, which ends the wait at once)
CONTROL_TIMEOUT = datetime.timedelta(days=365)


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """How a rank joins the process group: ``init_method`` (``env://`` under a launcher)."""

    init_method: str
    size: int


def launched_rank(size: int) -> int | None:
    """This process's rank when a launcher started it (None: standalone); ValueError when the
    launcher's world is not the tensor-parallel size."""
    if not all(name in os.environ for name in LAUNCHER_VARS):
        return None
    world = int(os.environ["WORLD_SIZE"])
    if world != size:
        raise ValueError(f"the launcher started {world} processes (WORLD_SIZE) but "
                         f"tensor_parallel_size is {size}: start one process per rank")
    return int(os.environ["RANK"])


def local_rendezvous(size: int) -> Rendezvous:
    """A free TCP port on this host for a standalone launch."""
    return Rendezvous(f"tcp://127.0.0.1:{free_port()}", size)


def rank_device(device: torch.device, rank: int, launched: bool) -> torch.device:
    """Rank ``rank``'s device when rank 0 runs on ``device`` (``launched``: under a launcher,
    ``cuda:LOCAL_RANK``)."""
    if device.type != "cuda":
        return device
    index = (int(os.environ.get("LOCAL_RANK", rank)) if launched
             else (device.index or 0) + rank)
    if index >= torch.cuda.device_count():
        raise ValueError(f"tensor-parallel rank {rank} needs cuda:{index}, but only "
                         f"{torch.cuda.device_count()} GPU(s) are visible")
    return torch.device("cuda", index)


def join_group(rendezvous: Rendezvous, rank: int, device: torch.device) -> TPShard:
    """Join the process group as ``rank`` (blocks until every rank joined); the model's
    collectives use the default group, NCCL on GPUs and gloo on the CPU."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=rendezvous.init_method, rank=rank,
                            world_size=rendezvous.size, timeout=TIMEOUT)
    return TPShard(rank, rendezvous.size)


def control_group() -> dist.ProcessGroup:
    """The gloo group of every rank that carries rank 0's messages (every rank calls this
    right after ``join_group``)."""
    return dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


def shard_arch(arch: ModelArchConfig, size: int) -> ModelArchConfig:
    """The architecture as one rank's KV cache sees it: its share of the KV heads."""
    if size == 1:
        return arch
    return dataclasses.replace(arch, num_key_value_heads=arch.num_key_value_heads // size)


def shard_scales(scales: torch.Tensor | None, shard: TPShard) -> torch.Tensor | None:
    """A checkpoint's KV scales [L, 2, Hkv] -> this rank's KV heads [L, 2, Hkv / size]."""
    if scales is None or shard.size == 1:
        return scales
    count = shard.split(scales.shape[2])
    return scales[:, :, shard.first(scales.shape[2]):][:, :, :count].contiguous()


def rank_flash_path(flash_path: str, rank: int) -> str:
    """Rank ``rank``'s cache file: ``{rank}`` in the path replaced, else the path itself for
    rank 0 and ``<path>.rank<r>`` for the others."""
    if RANK_FIELD in flash_path:
        return flash_path.replace(RANK_FIELD, str(rank))
    return flash_path if rank == 0 else f"{flash_path}.rank{rank}"


def rank_tier_config(tier: TierConfig, rank: int) -> TierConfig:
    """The tier options of rank ``rank``: its own cache file."""
    if tier.kv_offload != "flash":
        return tier
    return dataclasses.replace(tier, flash_path=rank_flash_path(tier.flash_path, rank))
