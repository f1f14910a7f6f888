"""The scheduler's messages to the tensor-parallel workers, over ``torch.distributed`` (gloo).

Rank 0 (the engine) is the only sender: first the :class:`WorkerSetup` (or a stop, when rank 0
failed before it), then :class:`Command` s. Each is broadcast to every rank
(``broadcast_object_list``); a command with ``reply`` set is answered by every worker with its
``RankReport`` (``gather_object``: tier jobs ended, blocks staged), the others are not answered. A step's command
carries the step's scheduled work, which the workers run through their part of the model in the
same order as rank 0 (the model's own collectives pair up across the ranks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from hifc.core.scheduler import ScheduledSeq
from hifc.tiers.jobs import IOOrder, RankReport


@dataclass(frozen=True)
class WorkerSetup:
    """What rank 0 resolved that every rank must use: KV blocks, the model length (which
    sizes the decode graphs) and the step's token budget (up to which the projections are
    tuned)."""

    num_gpu_blocks: int
    max_model_len: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class StepWork:
    """What the workers compute in a step: the scheduled sequences (rank 0's
    ``SchedulerOutput.scheduled``) and the prompt-logprob spans (row, first, end position)
    whose logits rank 0 computes (each a gathered logits collective)."""

    scheduled: list[ScheduledSeq]
    logprob_spans: list[tuple[int, int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Command:
    """``orders``: tier jobs to start (before the step); ``step``: a model step to run;
    ``wait``: (job id, timeout s) to wait for before replying; ``cancel_queued``: the tier
    closes, cancel prefix I/O not started; ``close_tier``: release the movers; ``stop``: leave
    the worker loop; ``reply``: answer with the finished jobs' outcomes."""

    orders: tuple[IOOrder, ...] = ()
    step: StepWork | None = None
    wait: tuple[int, float | None] | None = None
    cancel_queued: bool = False
    close_tier: bool = False
    stop: bool = False
    reply: bool = False


class ControlChannel:
    """One rank's end of the command channel (``group``: a gloo group of every rank)."""

    def __init__(self, rank: int, size: int, group: dist.ProcessGroup):
        self.rank = rank
        self.size = size
        self.group = group

    def send(self, command: Command | WorkerSetup) -> list[RankReport | None]:
        """Rank 0: broadcast ``command``; with ``reply``, every worker's report (by rank,
        None for rank 0)."""
        dist.broadcast_object_list([command], src=0, group=self.group)
        if isinstance(command, WorkerSetup) or not command.reply:
            return []
        replies: list = [None] * self.size
        dist.gather_object(None, replies, dst=0, group=self.group)
        return replies

    def receive(self) -> Command | WorkerSetup:
        """A worker: the next message (the setup first, then commands)."""
        box: list = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def answer(self, report: RankReport) -> None:
        """A worker: reply to a command that asked for it."""
        dist.gather_object(report, None, dst=0, group=self.group)
