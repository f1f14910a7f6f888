"""What a step's execution hands back to the scheduler and the engine (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TopLogprobs:
    """Log-probabilities of some tokens at some positions, one row per position: the chosen
    token's (``logprobs``, ``ranks``: 1 = most likely) and the ``k`` most likely tokens'
    (``top_ids``, ``top_logprobs``, best first; k is the largest any row asked for)."""

    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


@dataclass
class PromptLogprobs:
    """One scheduled sequence's prompt log-probabilities from this step: row j is about the
    prompt token at position ``start + j`` (predicted from the tokens before it)."""

    start: int
    values: TopLogprobs


@dataclass
class SamplerOutput:
    """The sampler's result for one step: ``token_ids[i]`` is the token sampled for the i-th
    sequence that samples in the step (``SchedulerOutput.sampling``: the scheduled sequences
    whose chunk ends at their last known token, in scheduled order). ``logprobs`` (row i: the
    sampled token's) is set when such a request asked for log-probabilities;
    ``prompt_logprobs`` maps a row of ``SchedulerOutput.scheduled`` (any chunk of a prompt) to
    the prompt log-probabilities this step computed for it."""

    token_ids: list[int]
    logprobs: TopLogprobs | None = None
    prompt_logprobs: dict[int, PromptLogprobs] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)
