"""What a step's execution hands back to the scheduler (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplerOutput:
    """The sampler's result for one step: ``token_ids[i]`` is the token sampled for the i-th
    sequence that samples in the step (``SchedulerOutput.sampling``: the scheduled sequences
    whose chunk ends at their last known token, in scheduled order). Per-token extras that a request
    asks for (log-probabilities, say) travel beside the ids in this object."""

    token_ids: list[int]

    def __len__(self) -> int:
        return len(self.token_ids)
