"""How many threads torch uses for CPU work (``cpu_threads``).

torch's default is one thread per core of the machine. On a small machine whose cores other
processes also use, those threads wait for each other at every operation: the README's quick
start took 3m50s on a busy 2-core machine with the default and 13 s with one thread. So on CPU
the engine uses one thread fewer than the cores this process may run on (at least one), unless
``cpu_threads`` says otherwise or ``OMP_NUM_THREADS`` is set (the operator already chose). On a
GPU only an explicit ``cpu_threads`` changes torch's setting.
"""
from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cores(cpu_max_path: str = CGROUP_CPU_MAX) -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    try:
        with open(cpu_max_path) as f:
            quota, period = f.read().split()[:2]  # "max 100000" or "200000 100000"
        limit = cores if quota == "max" else int(quota) // int(period)
    except (OSError, ValueError):  # no cgroup v2 quota to read
        return cores
    return max(1, min(cores, limit))


def default_cpu_threads() -> int | None:
    """Usable cores minus one (at least 1); None when OMP_NUM_THREADS is set."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, usable_cores() - 1)


def apply_cpu_threads(requested: int | None, device: torch.device) -> int:
    """Set torch's CPU threads (process-wide) as described above; returns the count in use."""
    threads = requested
    if threads is None and device.type == "cpu":
        threads = default_cpu_threads()
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
        logger.info("torch uses %d CPU thread(s)", threads)
    return torch.get_num_threads()
