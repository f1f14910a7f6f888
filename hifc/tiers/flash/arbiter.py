"""One flash device shared by several engine replicas (processes): the bandwidth arbiter.

Without it, replicas that swap to one SSD each keep up to ``flash_io_threads`` large I/Os queued
on it, and one replica's swap-out burst puts hundreds of MiB in the device queue ahead of
another replica's swap-in, which a resumed sequence waits for. The arbiter admits every
replica's I/O under one budget of bytes in flight (``window_bytes``), so an I/O that arrives
waits for at most the budget to drain, and chooses whom to admit:

1. the I/O of a replica whose engine is stalled (it has nothing to run until its swap I/O
   completes, see ``stall``), whose GPU idles meanwhile, before anyone else's;
2. then by priority (``IOPriority``): swap-ins (a sequence waits to resume) before swap-outs
   (GPU blocks wait for the write) before prefix-store writes (nobody waits);
3. within those, the replica served the fewest bytes of the priority so far (fair queueing on
   bytes; a replica that starts waiting is credited with the priority's current virtual time,
   so time spent idle earns it no burst later).

An I/O larger than the budget is admitted when nothing else is in flight. The budget is
self-clocking: it needs no bandwidth figure and follows the device's actual rate as the mix of
reads and writes changes. The device's rate is measured (bytes completed per second during
which arbitrated I/O was in flight) and reported with each class's bytes and admission waits,
per device and per replica.

The state lives in shared memory (``multiprocessing`` RawArrays under one Lock): the front end
creates the arbiter and hands it to each replica process when it spawns it. Waiters sleep on
their replica's semaphore, which every state change releases once per waiting thread; a
release never blocks, so a replica that died cannot hang the others (a cross-process Condition
would: its notify waits for every sleeper to wake), and a short timeout re-checks in any case.
"""
from __future__ import annotations

import multiprocessing
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from hifc.tiers.flash.io_base import FileIO, IOPriority

PRIORITIES = tuple(IOPriority)
PRIORITY_NAMES = tuple(p.name.lower() for p in PRIORITIES)  # swap_in, swap_out, prefix_write
RECHECK_S = 0.05  # a waiter re-checks at least this often, rung or not
_BUSY_SINCE, _BUSY_S, _COMPLETED, _PEAK = range(4)  # device cells


class DeviceArbiter:
    """The shared admission state of one flash device (see the module docstring).

    ``acquire`` / ``release`` bracket each I/O of replica ``0 <= replica < num_replicas``; an
    instance is passed to replica processes at spawn (it holds ``multiprocessing`` objects of
    ``ctx``, a spawn context by default). ``clock`` only times the metrics."""

    def __init__(self, device: str, num_replicas: int, window_bytes: int, *, ctx=None,
                 clock: Callable[[], float] = time.monotonic):
        if num_replicas < 1 or window_bytes < 1:
            raise ValueError("an arbiter needs at least one replica and a positive window")
        ctx = ctx or multiprocessing.get_context("spawn")
        self.device = device
        self.num_replicas = num_replicas
        self.window_bytes = window_bytes
        self._clock = clock
        self._lock = ctx.Lock()
        self._doorbells = [ctx.Semaphore(0) for _ in range(num_replicas)]
        cells = len(PRIORITIES) * num_replicas  # one per (priority, replica)
        self._inflight = ctx.RawArray("q", num_replicas)  # bytes admitted, not yet released
        self._stalled = ctx.RawArray("q", num_replicas)  # engine threads waiting on I/O
        self._waiting = ctx.RawArray("q", cells)  # threads waiting for admission
        self._served = ctx.RawArray("d", cells)  # fair-queueing tags (bytes)
        self._vtime = ctx.RawArray("d", len(PRIORITIES))  # tag of the last admission per class
        self._bytes = ctx.RawArray("q", cells)  # bytes admitted
        self._waits = ctx.RawArray("q", cells)  # admissions that had to wait
        self._wait_s = ctx.RawArray("d", cells)  # seconds those waited
        self._dev = ctx.RawArray("d", 4)  # busy since, busy seconds, completed bytes, peak

    # -- admission ---------------------------------------------------------------------------
    def acquire(self, replica: int, nbytes: int, priority: IOPriority) -> float:
        """Block until replica ``replica`` may start an I/O of ``nbytes``; seconds waited."""
        self._check_replica(replica)
        cell = self._cell(priority, replica)
        with self._lock:
            if self._waiting[cell] == 0:  # starts waiting: no credit for time spent idle
                self._served[cell] = max(self._served[cell], self._vtime[priority])
            self._waiting[cell] += 1
        start, waited = self._clock(), False
        while True:
            with self._lock:
                if self._may_admit(replica, nbytes, priority):
                    self._waiting[cell] -= 1
                    seconds = self._clock() - start if waited else 0.0
                    self._admit(cell, replica, nbytes, priority, seconds if waited else None)
                    self._ring()  # a lower class may fit in what is left
                    return seconds
            waited = True
            self._doorbells[replica].acquire(timeout=RECHECK_S)

    def release(self, replica: int, nbytes: int) -> None:
        """The I/O of ``nbytes`` that ``acquire`` admitted is done (or failed)."""
        with self._lock:
            if nbytes > self._inflight[replica]:
                raise ValueError(f"replica {replica} releases {nbytes} bytes but holds "
                                 f"{self._inflight[replica]}")
            self._inflight[replica] -= nbytes
            self._dev[_COMPLETED] += nbytes
            if not self._total_inflight():
                self._dev[_BUSY_S] += self._clock() - self._dev[_BUSY_SINCE]
            self._ring()

    @contextmanager
    def stall(self, replica: int) -> Iterator[None]:
        """The replica's engine waits for its swap I/O with nothing else to run: its I/O goes
        first while inside."""
        self._check_replica(replica)
        with self._lock:
            self._stalled[replica] += 1
            self._ring()
        try:
            yield
        finally:
            with self._lock:
                self._stalled[replica] -= 1
                self._ring()

    def forget(self, replica: int) -> None:
        """Drop what a replica that exited held or waited for, so it blocks no one."""
        with self._lock:
            self._inflight[replica] = 0
            self._stalled[replica] = 0
            for priority in PRIORITIES:
                self._waiting[self._cell(priority, replica)] = 0
            self._ring()

    @contextmanager
    def grant(self, replica: int, nbytes: int, priority: IOPriority) -> Iterator[float]:
        """``with arbiter.grant(...)``: the I/O runs inside; yields the seconds waited."""
        waited = self.acquire(replica, nbytes, priority)
        try:
            yield waited
        finally:
            self.release(replica, nbytes)

    def _may_admit(self, replica: int, nbytes: int, priority: IOPriority) -> bool:
        total = self._total_inflight()
        if total and total + nbytes > self.window_bytes:
            return False
        mine = self._rank(priority, replica)
        waiting = [(q, r) for q in PRIORITIES for r in range(self.num_replicas)
                   if self._waiting[self._cell(q, r)]]
        if any(self._rank(q, r) < mine for q, r in waiting):
            return False
        least = min(self._served[self._cell(q, r)] for q, r in waiting
                    if q == priority and self._rank(q, r) == mine)
        return self._served[self._cell(priority, replica)] <= least

    def _rank(self, priority: IOPriority, replica: int) -> tuple[int, int]:
        """Admission order: stalled replicas first, then by priority (smaller goes first)."""
        return (0 if self._stalled[replica] else 1, int(priority))

    def _admit(self, cell: int, replica: int, nbytes: int, priority: IOPriority,
               waited_s: float | None) -> None:
        if not self._total_inflight():
            self._dev[_BUSY_SINCE] = self._clock()
        self._vtime[priority] = self._served[cell]
        self._served[cell] += nbytes
        self._inflight[replica] += nbytes
        self._dev[_PEAK] = max(self._dev[_PEAK], self._total_inflight())
        self._bytes[cell] += nbytes
        if waited_s is not None:
            self._waits[cell] += 1
            self._wait_s[cell] += waited_s

    def _ring(self) -> None:
        """Wake every waiting thread (they re-check under the lock)."""
        r = self.num_replicas
        for replica in range(r):
            for _ in range(sum(self._waiting[q * r + replica] for q in PRIORITIES)):
                self._doorbells[replica].release()

    def _total_inflight(self) -> int:
        return sum(self._inflight)

    def _cell(self, priority: IOPriority, replica: int) -> int:
        return int(priority) * self.num_replicas + replica

    def _check_replica(self, replica: int) -> None:
        if not 0 <= replica < self.num_replicas:
            raise ValueError(f"replica {replica} out of range [0, {self.num_replicas})")

    # -- metrics -----------------------------------------------------------------------------
    def waiting(self) -> dict[str, int]:
        """Threads waiting for admission, by priority name."""
        with self._lock:
            r = self.num_replicas
            return {name: sum(self._waiting[q * r:(q + 1) * r])
                    for q, name in zip(PRIORITIES, PRIORITY_NAMES)}

    def replica_stats(self, replica: int) -> dict[str, float | int]:
        """One replica's bytes, admission waits and seconds waited, by priority."""
        self._check_replica(replica)
        with self._lock:
            return self._class_stats([replica])

    def stats(self) -> dict:
        """The device's: window, measured rate, and the classes' totals over all replicas."""
        with self._lock:
            busy = self._dev[_BUSY_S]
            if self._total_inflight():
                busy += self._clock() - self._dev[_BUSY_SINCE]
            done = self._dev[_COMPLETED]
            return {"device": self.device, "replicas": self.num_replicas,
                    "window_bytes": self.window_bytes, "inflight_bytes": self._total_inflight(),
                    "stalled_replicas": sum(1 for n in self._stalled if n),
                    "peak_inflight_bytes": int(self._dev[_PEAK]), "busy_seconds": busy,
                    "completed_bytes": int(done),
                    "measured_gibps": done / busy / (1 << 30) if busy > 0 else None,
                    **self._class_stats(range(self.num_replicas))}

    def _class_stats(self, replicas) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for priority, name in zip(PRIORITIES, PRIORITY_NAMES):
            cells = [self._cell(priority, r) for r in replicas]
            out[f"{name}_bytes"] = sum(self._bytes[c] for c in cells)
            out[f"{name}_waits"] = sum(self._waits[c] for c in cells)
            out[f"{name}_wait_seconds"] = sum(self._wait_s[c] for c in cells)
        return out


class ArbitratedIO(FileIO):
    """Wraps a backend: each read or write is admitted by the device's arbiter first, at the
    priority the caller gives, as replica ``replica``."""

    def __init__(self, inner: FileIO, arbiter: DeviceArbiter, replica: int):
        super().__init__()
        arbiter._check_replica(replica)
        self.inner = inner
        self.arbiter = arbiter
        self.replica = replica
        self.name = f"{inner.name}+arbiter"
        self.direct = inner.direct
        self.notes = inner.notes + [f"shares {arbiter.device} with {arbiter.num_replicas - 1} "
                                    f"other replica(s) through an arbiter"]

    def staging_device(self, kv_device: torch.device) -> torch.device:
        return self.inner.staging_device(kv_device)

    def write(self, buf: torch.Tensor, file_offset: int,
              priority: IOPriority = IOPriority.SWAP_OUT) -> int:
        with self.arbiter.grant(self.replica, buf.numel(), priority):
            return self.inner.write(buf, file_offset, priority)

    def read(self, buf: torch.Tensor, file_offset: int,
             priority: IOPriority = IOPriority.SWAP_IN) -> int:
        with self.arbiter.grant(self.replica, buf.numel(), priority):
            return self.inner.read(buf, file_offset, priority)

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class DeviceShare:
    """One replica's share of a flash device: the device's arbiter and the replica's index in
    it. What a replica's engine passes down to its flash tier (picklable at spawn)."""

    arbiter: DeviceArbiter
    replica: int

    def wrap(self, io: FileIO) -> ArbitratedIO:
        return ArbitratedIO(io, self.arbiter, self.replica)

    def stats(self) -> dict[str, float | int]:
        return self.arbiter.replica_stats(self.replica)

    def stalled(self):
        """Context: the replica's engine waits for its I/O (see ``DeviceArbiter.stall``)."""
        return self.arbiter.stall(self.replica)
