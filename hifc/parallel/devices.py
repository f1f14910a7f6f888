"""Where each replica runs, and which replicas' flash files share a device."""
from __future__ import annotations

import os

import torch

from hifc.config import EngineConfig


def replica_devices(config: EngineConfig) -> list[str]:
    """The device of each replica: ``cuda:i`` for replica i on GPUs (a single replica: the one
    asked for, ``cuda:0`` for ``cuda``), else ``cpu`` for all."""
    n = config.parallel.data_parallel_size
    wants_gpu = config.device.startswith("cuda") or (config.device == "auto"
                                                     and torch.cuda.is_available())
    if not wants_gpu:
        return ["cpu"] * n
    if n == 1:
        return [config.device if config.device.startswith("cuda:") else "cuda:0"]
    visible = torch.cuda.device_count()
    if visible < n:
        raise ValueError(f"data_parallel_size={n} needs {n} GPUs (one per replica); "
                         f"{visible} visible")
    return [f"cuda:{i}" for i in range(n)]


def flash_device_of(path: str) -> tuple[int, str]:
    """(device number, label) of the file system holding ``path``'s directory."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        dev = os.stat(directory).st_dev
    except OSError as exc:
        raise ValueError(f"the directory of flash file {path!r} is not usable: "
                         f"{exc.strerror}") from None
    return dev, f"{os.major(dev)}:{os.minor(dev)}"


def shared_flash_devices(paths: list[str]) -> list[tuple[str, list[int]]]:
    """(device label, the replicas whose files it holds) for each device that holds the files
    of two or more replicas (``paths[i]`` is replica i's), in order of first replica."""
    groups: dict[int, tuple[str, list[int]]] = {}
    for replica, path in enumerate(paths):
        dev, label = flash_device_of(path)
        groups.setdefault(dev, (label, []))[1].append(replica)
    return [group for group in groups.values() if len(group[1]) > 1]
