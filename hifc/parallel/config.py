"""``ParallelConfig``: how many engine replicas (data parallelism) and GPUs per replica, and how
replicas that share a flash device share it. Torch-free.

With ``data_parallel_size`` N > 1 every replica needs a cache file of its own (a file is locked
by the one process that opens it), so ``flash_path`` names N files: a template containing
``{replica}`` (``/nvme/hifc-{replica}.kv`` -> ``hifc-0.kv``, ``hifc-1.kv``, ...) or N
comma-separated paths. With one replica the path is used as given (a template becomes
replica 0's file). Files in one directory share a device (the paper's 2:1 topology); files on
different devices do not (2:2).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hifc.options import option

if TYPE_CHECKING:
    from hifc.config import EngineConfig

REPLICA_FIELD = "{replica}"
MAX_PARALLEL_SIZE = 1024
MAX_WINDOW_MIB = 1 << 16


@dataclass(frozen=True)
class ParallelConfig:
    """Parallelism."""

    data_parallel_size: int = option(
        1, "engine replicas, one per GPU (replica i on cuda:i), behind one front end that "
        "sends each request to the replica with the fewest outstanding tokens", short="-dp")
    tensor_parallel_size: int = option(
        1, "GPUs splitting the model (tensor parallelism): one process per GPU, rank 0 the "
        "engine's; each rank swaps its KV shard to a flash file of its own (flash_path for "
        "rank 0, flash_path.rank<r> or {rank} in the path for the others)", short="-tp")
    flash_arbiter: bool = option(
        True, "replicas whose flash files are on one device share it through an arbiter that "
        "admits their I/O under one in-flight budget: a stalled engine's first, then swap-ins, "
        "then swap-outs")
    flash_arbiter_window_mib: int | None = option(
        None, "flash I/O in flight on a shared device, all its replicas together, in MiB "
        "(default: 4 x flash_chunk_mib)")

    def __post_init__(self) -> None:
        _int_in("data_parallel_size", self.data_parallel_size, 1, MAX_PARALLEL_SIZE)
        _int_in("tensor_parallel_size", self.tensor_parallel_size, 1, MAX_PARALLEL_SIZE)
        if self.tensor_parallel_size > 1 and self.data_parallel_size > 1:
            raise ValueError("data_parallel_size > 1 with tensor_parallel_size > 1 is not "
                             "available; choose one of them")
        if not isinstance(self.flash_arbiter, bool):
            raise ValueError(f"flash_arbiter must be True or False, got {self.flash_arbiter!r}")
        if self.flash_arbiter_window_mib is not None:
            _int_in("flash_arbiter_window_mib", self.flash_arbiter_window_mib, 1,
                    MAX_WINDOW_MIB)


def check_replicas(config: "EngineConfig") -> None:
    """The checks that need the other options: one flash file per replica, one device each."""
    n = config.parallel.data_parallel_size
    if n > 1 and config.device.startswith("cuda:"):
        raise ValueError(f"device {config.device!r} names one GPU, but data_parallel_size={n} "
                         "runs replica i on cuda:i: give device 'cuda' or 'auto'")
    if config.tier.kv_offload == "flash":
        replica_flash_paths(config.tier.flash_path, n)


def replica_flash_paths(flash_path: str, num_replicas: int) -> list[str]:
    """The cache file of each replica (see the module docstring); ValueError unless there is
    exactly one distinct file per replica."""
    if REPLICA_FIELD in flash_path:
        paths = [flash_path.replace(REPLICA_FIELD, str(i)) for i in range(num_replicas)]
    elif num_replicas > 1:
        paths = [p.strip() for p in flash_path.split(",")]
        if len(paths) != num_replicas or not all(paths):
            raise ValueError(
                f"data_parallel_size={num_replicas} needs one flash file per replica: a "
                f"template containing {REPLICA_FIELD} (e.g. /nvme/hifc-{REPLICA_FIELD}.kv) or "
                f"{num_replicas} comma-separated paths; got {flash_path!r}")
    else:
        paths = [flash_path]
    if len({os.path.abspath(p) for p in paths}) != len(paths):
        raise ValueError(f"flash_path {flash_path!r} names one file for several replicas; each "
                         "replica needs its own cache file")
    return paths


def replica_config(config: "EngineConfig", index: int, device: str | None = None
                   ) -> "EngineConfig":
    """The single-engine config of replica ``index``: its own flash file, its device (``device``
    when given), data_parallel_size 1."""
    tier = config.tier
    if tier.kv_offload == "flash":
        path = replica_flash_paths(tier.flash_path, config.parallel.data_parallel_size)[index]
        tier = dataclasses.replace(tier, flash_path=path)
    return dataclasses.replace(
        config, device=device or config.device, tier=tier,
        parallel=dataclasses.replace(config.parallel, data_parallel_size=1))


def _int_in(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
