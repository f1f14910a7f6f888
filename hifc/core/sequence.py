"""A request's token sequence and its life-cycle state."""
from __future__ import annotations

import enum

from hifc.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPING_OUT = "swapping_out"  # KV being written to the tier; GPU blocks held until staged
    SWAPPED = "swapped"  # KV only in the tier
    SWAPPING_IN = "swapping_in"  # KV being read back into freshly allocated GPU blocks
    LOADING = "loading_prefix"  # cached prefix blocks being read from the flash prefix store
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        # checked several times per sequence and step: a lookup of the value's string, whose
        # hash is cached (an enum member's own hash is a Python call)
        return self._value_ in _FINISHED


_FINISHED = frozenset(s.value for s in (SequenceStatus.FINISHED_STOPPED,
                                        SequenceStatus.FINISHED_LENGTH,
                                        SequenceStatus.FINISHED_ABORTED))


class Sequence:
    """Prompt and generated tokens of one request; the source of truth for its KV cache."""

    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, eos_token_ids: frozenset[int], arrival: int):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        # grows only through append_token, which keeps num_tokens (read several times per
        # sequence and step) with it
        self.output_token_ids: list[int] = []
        self.num_tokens = len(self.prompt_token_ids)  # prompt + output
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids
        self.arrival = arrival
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache (or a scheduled step's)
        # tokens sampled by scheduled steps whose ids the host has not applied yet: the one of
        # the step being scheduled, and under asynchronous scheduling the one of the step in
        # flight (the next step computes it from the device, see PENDING_TOKEN)
        self.num_pending_tokens = 0
        self.num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache
        self.block_hashes: list[bytes] = []  # content hashes of the full blocks (prefix cache)
        self.generation = 0  # bumped at every preemption; tags the sequence's stored KV
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None  # the stop token id or string that ended it
        # its last token is the EOS or stop token that ended it (or a stop token its grammar
        # accepted): the text leaves it out, unless include_stop_str_in_output (as vLLM's does)
        self.ended_on_stop_token = False

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens whose K/V is not computed yet (a pending one included); the last one's logits
        give the next token."""
        return self.num_tokens + self.num_pending_tokens - self.num_computed_tokens

    @property
    def num_generated_before_sample(self) -> int:
        """Tokens generated before the one the step being launched samples for this sequence
        (the pending ones of earlier steps included, that step's own excluded): the sampled
        token's index among the outputs."""
        return len(self.output_token_ids) + max(0, self.num_pending_tokens - 1)

    def ends_by_length_with_pending(self, max_model_len: int) -> bool:
        """True when the pending tokens already bring the sequence to ``max_tokens`` or the
        context limit: it finishes by length once they arrive, so it needs no further step."""
        if not self.num_pending_tokens:
            return False
        max_tokens = self.sampling_params.max_tokens
        num_output = len(self.output_token_ids) + self.num_pending_tokens
        return ((max_tokens is not None and num_output >= max_tokens)
                or self.num_tokens + self.num_pending_tokens >= max_model_len)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def token_ids(self, start: int = 0, end: int | None = None) -> list[int]:
        """Tokens [start, end) of prompt + output."""
        n_prompt = len(self.prompt_token_ids)
        end = self.num_tokens if end is None else end
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt:end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - n_prompt]

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.is_finished else None

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.num_tokens += 1

    def stop_token_ids_before_min_tokens(self) -> tuple[int, ...]:
        """The tokens that would end the sequence (EOS unless ignored, stop_token_ids): the
        sampler bans them until ``min_tokens`` tokens are generated."""
        params = self.sampling_params
        eos = () if params.ignore_eos else tuple(self.eos_token_ids)
        return eos + params.stop_token_ids

    def stop_reason_after_append(self, max_model_len: int) -> SequenceStatus | None:
        """Token-based stop conditions checked after a new token was appended (EOS and stop
        tokens only once ``min_tokens`` tokens are out); sets ``stop_reason`` to a matching
        stop token id."""
        params = self.sampling_params
        num_output = len(self.output_token_ids)
        if num_output >= params.min_tokens:
            last = self.output_token_ids[-1]
            if not params.ignore_eos and last in self.eos_token_ids:
                self.ended_on_stop_token = True
                return SequenceStatus.FINISHED_STOPPED
            if last in params.stop_token_ids:
                self.stop_reason = last
                self.ended_on_stop_token = True
                return SequenceStatus.FINISHED_STOPPED
        max_tokens = params.max_tokens
        if (max_tokens is not None and num_output >= max_tokens) \
                or self.num_tokens >= max_model_len:
            return SequenceStatus.FINISHED_LENGTH
        return None
