"""What the engine returns for a request (vLLM's shapes and names)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Logprob:
    """One token's log-probability at one position; rank 1 is the most likely token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# per position: token id -> Logprob (the chosen token first, then the top-k tokens)
PositionLogprobs = dict[int, Logprob]


class FlatLogprobs(Sequence):
    """A completion's logprobs, one ``PositionLogprobs`` per generated token, kept as flat lists
    and turned into dicts only when read (a step then appends a few numbers per sequence, not
    k + 1 objects). Append-only: :meth:`view` is a fixed-length snapshot sharing the lists."""

    def __init__(self, token_text: Callable[[int], str | None] | None = None):
        self._token_text = token_text  # a token's text (None: no decoded tokens)
        self._token_ids: list[int] = []
        self._logprobs: list[float] = []
        self._ranks: list[int] = []
        self._top_ids: list[list[int]] = []
        self._top_logprobs: list[list[float]] = []
        self._length: int | None = None  # a view's length; None: all that was appended

    def append(self, token_id: int, logprob: float, rank: int, top_ids: list[int],
               top_logprobs: list[float]) -> None:
        self._token_ids.append(token_id)
        self._logprobs.append(logprob)
        self._ranks.append(rank)
        self._top_ids.append(top_ids)
        self._top_logprobs.append(top_logprobs)

    def view(self) -> "FlatLogprobs":
        snapshot = FlatLogprobs.__new__(FlatLogprobs)
        snapshot.__dict__.update(self.__dict__, _length=len(self))
        return snapshot

    def __len__(self) -> int:
        return len(self._token_ids) if self._length is None else self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("logprobs position out of range")
        return position_logprobs(self._token_ids[index], self._logprobs[index],
                                 self._ranks[index], self._top_ids[index],
                                 self._top_logprobs[index], self._token_text)


def position_logprobs(token_id: int, logprob: float, rank: int, top_ids: list[int],
                      top_logprobs: list[float],
                      token_text: Callable[[int], str | None] | None) -> PositionLogprobs:
    """One position's dict: the chosen token first, then the top tokens (ranks 1, 2, ...)."""
    text = token_text or (lambda _: None)
    position = {token_id: Logprob(logprob, rank, text(token_id))}
    for top_rank, (token, top_logprob) in enumerate(zip(top_ids, top_logprobs), start=1):
        if token not in position:
            position[token] = Logprob(top_logprob, top_rank, text(token))
    return position


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]  # generated token ids
    cumulative_logprob: float | None = None  # sum of the chosen tokens' logprobs (if asked)
    logprobs: Sequence[PositionLogprobs] | None = None  # one per generated token (if asked)
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that matched

    def finished(self) -> bool:
        return self.finish_reason is not None

    def extend(self, later: "CompletionOutput") -> None:
        """Append the next ``DELTA`` of the same completion: the two read as one. Its lists
        grow in place: they are its own (a ``DELTA``'s are fresh)."""
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        if later.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = list(later.logprobs)
            else:
                self.logprobs.extend(later.logprobs)
        self.cumulative_logprob = later.cumulative_logprob
        self.finish_reason, self.stop_reason = later.finish_reason, later.stop_reason


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
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache (vLLM's)

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

    def extend(self, later: "RequestOutput") -> None:
        """Append the request's next ``DELTA`` output: the two read as one (what each
        completion gained in both, the later state otherwise)."""
        mine = {c.index: c for c in self.outputs}
        for completion in later.outputs:
            if completion.index in mine:
                mine[completion.index].extend(completion)
            else:
                self.outputs.append(completion)
        self.outputs.sort(key=lambda c: c.index)
        if later.prompt_logprobs is not None:  # a DELTA output gives them once
            self.prompt_logprobs = later.prompt_logprobs
        self.finished, self.metrics = later.finished, later.metrics
        self.num_cached_tokens = later.num_cached_tokens


@dataclass
class DeltaProgress:
    """How much of one completion its ``DELTA`` outputs have given; :meth:`next` makes the
    next one from the completion's state."""

    tokens: int = 0
    chars: int = 0
    done: bool = False  # its finish has been given

    def next(self, index: int, text: str, shown: int, token_ids: Sequence[int],
             logprobs: Sequence[PositionLogprobs] | None, cumulative_logprob: float | None,
             finish_reason: str | None, stop_reason: int | str | None
             ) -> CompletionOutput | None:
        """What is new in ``text[:shown]``, ``token_ids`` (and ``logprobs``, one per token)
        since the last call; None: nothing."""
        num_tokens = len(token_ids)
        finished = finish_reason is not None
        if self.done or (num_tokens == self.tokens and shown <= self.chars and not finished):
            return None
        out = CompletionOutput(
            index, text[self.chars:shown], token_ids[self.tokens:], cumulative_logprob,
            None if logprobs is None else logprobs[self.tokens:num_tokens],
            finish_reason, stop_reason)
        self.tokens, self.chars, self.done = num_tokens, max(self.chars, shown), finished
        return out
