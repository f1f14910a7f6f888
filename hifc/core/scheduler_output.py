"""What the scheduler hands the runtime each step, and its limits (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from hifc.sampling_params import SamplingParams

# A token id in ScheduledSeq.token_ids that the host does not know yet: sampled by the step in
# flight (asynchronous scheduling). The runner takes it from that step's sampled ids on the
# device; it is always the one token of a decode.
PENDING_TOKEN = -1


class TierBlocks(Protocol):
    """What the scheduler needs of a swap tier's block space."""

    def can_reserve(self, n: int) -> bool: ...
    def reserve(self, n: int) -> list[int]: ...
    def free(self, ids: list[int]) -> None: ...


class ScheduledSeq(NamedTuple):
    """One sequence's work in a step: compute K/V for ``token_ids`` at positions
    ``start_pos..start_pos+len-1``; if ``samples`` (the chunk ends at the sequence's last
    token), sample the next token from the last one. A decode's token may be ``PENDING_TOKEN``.
    (A named tuple: one is built per sequence and step, three times faster than a frozen
    dataclass.)

    ``block_table`` is the scheduler's own table of the sequence, not a copy: read it when the
    step is launched (later steps append to it). A table object only ever grows; any other
    change makes a new object (``KVCacheManager``), so what a runner read of one object stays
    true of its first entries (``hifc.runtime.inputs.TableRows``)."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sampling_params: SamplingParams
    samples: bool = True

    @property
    def seq_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class SwapOrder:
    """Move one sequence's KV blocks. Swap-out pairs are (gpu, tier); swap-in pairs are
    (tier, gpu). ``owner`` = (sequence number, generation) tags the stored records."""

    request_id: str
    owner: tuple[int, int]
    pairs: list[tuple[int, int]]


@dataclass(frozen=True)
class PrefixRead:
    """Read one sequence's blocks from the flash prefix store: pairs are (hash, GPU block)."""

    request_id: str
    pairs: list[tuple[bytes, int]]


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq]
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)  # ended since the last step
    swap_out: list[SwapOrder] = field(default_factory=list)
    swap_in: list[SwapOrder] = field(default_factory=list)
    prefix_reads: list[PrefixRead] = field(default_factory=list)
    prefix_writes: list[tuple[int, bytes]] = field(default_factory=list)  # (GPU block, hash)

    @property
    def sampling(self) -> list[ScheduledSeq]:
        """The scheduled sequences that sample a token in this step, in scheduled order."""
        return [s for s in self.scheduled if s.samples]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.scheduled if len(s.token_ids) > 1)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # the most tokens a sequence prefills per step (0: any)
    # the most query-key pairs a step's prompt chunks attend over, summed (0: no limit)
    prefill_attention_budget: int = 0
