"""What a step's execution hands back to the scheduler (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplerOutput:
    """The sampler's result for one step: ``token_ids[i]`` is the token sampled for the i-th
    scheduled sequence (``SchedulerOutput.scheduled`` order). Per-token extras that a request
    asks for (log-probabilities, say) travel beside the ids in this object."""

    token_ids: list[int]

    def __len__(self) -> int:
        return len(self.token_ids)
