"""``TPDriver``: rank 0's hold on the tensor-parallel workers (the engine's process).

It starts the workers (standalone) or finds them (under a launcher), tells them the KV cache
size, sends each model step to them before rank 0 runs its own part (``announce``), and is the
tier's ``peers`` (:class:`hifc.tiers.tier.TierPeers`): tier jobs are queued as orders and go out
with the next command, outcomes (and the blocks swap-outs have staged) come back when the tier
polls or waits while a job is out on the workers. ``close`` stops the workers and leaves the process group.
"""
from __future__ import annotations

import logging
from collections import Counter

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from hifc.config import EngineConfig
from hifc.core.scheduler import ScheduledSeq
from hifc.layers.tensor_parallel import TPShard
from hifc.parallel.tp_control import Command, ControlChannel, StepWork, WorkerSetup
from hifc.parallel.tp_launch import (Rendezvous, control_group, join_group, launched_rank,
                                     local_rendezvous, rank_device)
from hifc.tiers.jobs import IOOrder, RankOutcome

logger = logging.getLogger(__name__)


class WorkerLost(RuntimeError):
    """A tensor-parallel worker stopped answering: the engine cannot run another step."""


class TPDriver:
    """Rank 0 of ``shard.size``; ``processes``: the workers it spawned (none under a launcher)."""

    def __init__(self, shard: TPShard, channel: ControlChannel, processes: list):
        self.shard = shard
        self.size = shard.size  # TierPeers: ranks, this one included
        self.channel = channel
        self.processes = processes
        self._orders: list[IOOrder] = []
        self._outcomes: dict[int, list[RankOutcome]] = {}  # job id -> workers' outcomes so far
        # swap-out job id -> pair index -> workers that have staged it
        self._staged: dict[int, Counter[int]] = {}
        self._closed = False
        self.lost: str | None = None  # what happened, once a worker stopped answering

    @classmethod
    def start(cls, config: EngineConfig, device: torch.device) -> "TPDriver":
        """Spawn (standalone) or meet (launcher) the workers and join the process group."""
        size = config.parallel.tensor_parallel_size
        launched = launched_rank(size)
        processes = []
        if launched is None:
            from hifc.parallel.tp_worker import run_worker

            rendezvous = local_rendezvous(size)
            ctx = torch_mp.get_context("spawn")
            for rank in range(1, size):
                process = ctx.Process(target=run_worker, name=f"hifc-tp-{rank}", daemon=True,
                                      args=(config, rank, rendezvous, device, False))
                process.start()
                processes.append(process)
        else:
            rendezvous = Rendezvous("env://", size)
        try:
            shard = join_group(rendezvous, 0, rank_device(device, 0, launched is not None))
            channel = ControlChannel(0, size, control_group())
        except BaseException:
            _stop(processes)
            raise
        return cls(shard, channel, processes)

    def setup(self, setup: WorkerSetup) -> None:
        """Tell every worker the sizes rank 0 resolved (they build their KV cache next)."""
        self.channel.send(setup)

    # -- steps ---------------------------------------------------------------------------------
    def announce(self, scheduled: list[ScheduledSeq],
                 logprob_spans: list[tuple[int, int, int]]) -> None:
        """Send a step's work (with the orders queued before it); rank 0 runs its part next."""
        work = [w._replace(sampling_params=None) for w in scheduled]
        self._send(Command(orders=self._take_orders(), step=StepWork(work, logprob_spans)))

    # -- TierPeers -----------------------------------------------------------------------------
    # Once a worker is lost, the tier's jobs end with this rank's part (the engine runs no
    # further step; its close must not wait for ranks that are gone).
    def launch(self, order: IOOrder) -> None:
        self._orders.append(order)
        self._outcomes[order.job_id] = []

    def collect(self) -> None:
        if self._orders or any(len(o) < self.size - 1 for o in self._outcomes.values()):
            self._send_to_peers(Command(orders=self._take_orders(), reply=True))

    def request_wait(self, job_id: int, timeout: float | None) -> None:
        self._send_to_peers(Command(orders=self._take_orders(), wait=(job_id, timeout),
                                    reply=True))

    def tracks(self, job_id: int) -> bool:
        return self.lost is None and job_id in self._outcomes

    def is_done(self, job_id: int) -> bool:
        return len(self._outcomes.get(job_id, ())) >= self.size - 1

    def staged(self, job_id: int) -> set[int]:
        counts = self._staged.get(job_id)
        return {i for i, n in counts.items() if n >= self.size - 1} if counts else set()

    def pop(self, job_id: int) -> list[RankOutcome]:
        self._staged.pop(job_id, None)
        return self._outcomes.pop(job_id)

    def cancel_queued(self) -> None:
        self._send_to_peers(Command(orders=self._take_orders(), cancel_queued=True))

    def close(self) -> None:
        """TierPeers: every job ended; the workers release their movers."""
        self._send_to_peers(Command(close_tier=True))

    def _send_to_peers(self, command: Command) -> None:
        """A tier command: dropped once a worker is lost."""
        if self.lost is None:
            self._send(command)

    # -- the rest ------------------------------------------------------------------------------
    def _take_orders(self) -> tuple[IOOrder, ...]:
        orders, self._orders = tuple(self._orders), []
        return orders

    def _send(self, command: Command) -> None:
        if self.lost is None and not all(p.is_alive() for p in self.processes):
            # a worker this rank spawned has exited: a broadcast to it can block until gloo's
            # timeout (30 min) instead of failing
            self.lost = self._loss("found before sending")
        if self.lost is not None:
            raise WorkerLost(self.lost)
        try:
            reports = self.channel.send(command)
        except Exception as exc:  # gloo: the connection to a worker closed, or timed out
            self.lost = self._loss(exc)
            raise WorkerLost(self.lost) from exc
        for report in reports:
            if report is None:  # rank 0's place
                continue
            for outcome in report.outcomes:
                self._outcomes[outcome.job_id].append(outcome)
            for job_id, pairs in report.staged.items():
                if job_id in self._outcomes:
                    self._staged.setdefault(job_id, Counter()).update(pairs)

    def _loss(self, exc: Exception | str) -> str:
        """What to tell the user when the channel failed: which workers exited, if known."""
        dead = [f"{p.name} (exit code {p.exitcode})" for p in self.processes
                if not p.is_alive()]
        who = (f"tensor-parallel worker {', '.join(dead)} exited" if dead else
               "a tensor-parallel worker stopped answering")
        return f"{who}; this engine cannot continue and must be rebuilt ({exc})"

    def shutdown(self) -> None:
        """Stop the workers and leave the process group (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.lost is None:
                self.channel.send(Command(stop=True))
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a lost worker leaves the group broken
                if self.lost is None:
                    raise
            _stop(self.processes)


def _stop(processes: list, timeout_s: float = 30.0) -> None:
    for process in processes:
        process.join(timeout_s)
        if process.is_alive():
            logger.warning("tensor-parallel worker %s did not stop; terminating it",
                           process.name)
            process.terminate()
