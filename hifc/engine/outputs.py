"""What the engine returns for a request (vLLM's shapes and names)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    """One token's log-probability at one position; rank 1 is the most likely token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# per position: token id -> Logprob (the top-k tokens and the chosen one)
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]  # generated token ids
    cumulative_logprob: float | None = None  # sum of the chosen tokens' logprobs (if asked)
    logprobs: list[PositionLogprobs] | None = None  # one per generated token (if asked)
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that matched

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Wall-clock times (``time.time()``) of a request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_in_queue(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    # position 0 is None (nothing predicts the first token), then one entry per prompt token
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    # Flat access for the common single-completion case.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason
