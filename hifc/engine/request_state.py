"""The engine's record of a request: its n completions (one sequence each) and what their
outputs accumulate (text, log-probabilities, stop reasons, times)."""
from __future__ import annotations

from dataclasses import dataclass, field

from hifc.core.outputs import PromptLogprobs, SamplerOutput
from hifc.core.sequence import Sequence
from hifc.engine.bad_words import BadWords
from hifc.engine.detokenizer import IncrementalDetokenizer
from hifc.engine.logprobs import LogprobsBuilder
from hifc.engine.outputs import (CompletionOutput, DeltaProgress, FlatLogprobs,
                                 PositionLogprobs, RequestMetrics, RequestOutput)
from hifc.sampling_params import RequestOutputKind, SamplingParams
from hifc.structured.grammar import GrammarState


@dataclass
class CompletionState:
    """One of a request's completions: its sequence and what its output accumulates."""

    index: int
    seq: Sequence
    request: "RequestState"
    detokenizer: IncrementalDetokenizer | None
    grammar: GrammarState | None = None
    bad_words: BadWords | None = None
    logprobs: FlatLogprobs | None = None
    cumulative_logprob: float | None = None
    sent: DeltaProgress = field(default_factory=DeltaProgress)  # output_kind DELTA
    # characters at the end of the text that a stop string may still cut: outputs leave them
    # out until the sequence finishes (as vLLM's do)
    holdback: int = field(init=False)
    # the text is only read at the end (FINAL_ONLY) and no stop string is searched in it: it is
    # decoded then, in one catch-up, not token by token at every step
    text_at_end: bool = field(init=False)

    def __post_init__(self) -> None:
        params = self.seq.sampling_params
        self.holdback = params.stop_holdback
        self.text_at_end = (self.detokenizer is not None and not params.stop
                            and params.output_kind is RequestOutputKind.FINAL_ONLY)

    def start_logprobs(self, builder: LogprobsBuilder) -> None:
        """Collect logprobs (the request asked for them)."""
        params = self.seq.sampling_params
        self.logprobs = FlatLogprobs(builder.token_text if params.detokenize else None)
        self.cumulative_logprob = 0.0

    def record(self, sampled: SamplerOutput, row: int) -> str | None:
        """Take in the token this sequence just accepted (row ``row`` of the step): its
        log-probabilities, grammar state and text. Returns the stop string the text hit, if
        any."""
        seq, params = self.seq, self.seq.sampling_params
        values = sampled.logprobs
        if self.logprobs is not None and values is not None:
            k = params.logprobs
            self.logprobs.append(values.token_ids[row], values.logprobs[row], values.ranks[row],
                                 values.top_ids[row][:k], values.top_logprobs[row][:k])
            self.cumulative_logprob += values.logprobs[row]
        if self.grammar is not None:
            self.grammar.advance(seq.output_token_ids)
            if self.grammar.accepted_stop:  # under ignore_eos too: the grammar ends it there
                seq.ended_on_stop_token = True
        if self.detokenizer is None or self.text_at_end:
            return None
        check_stop = len(seq.output_token_ids) >= params.min_tokens
        return self.detokenizer.update(self._text_tokens(), check_stop)

    def _text_tokens(self) -> list[int]:
        """The output tokens the text shows: all but an EOS or stop token that ended the
        sequence, unless ``include_stop_str_in_output``."""
        seq = self.seq
        if seq.ended_on_stop_token and not seq.sampling_params.include_stop_str_in_output:
            return seq.output_token_ids[:-1]
        return seq.output_token_ids

    def _shown_text(self, finished: bool) -> tuple[str, int]:
        """The text, and how much of it outputs may show now (all once ``finished``)."""
        if self.detokenizer is None:
            return "", 0
        if self.text_at_end:
            self.detokenizer.update(self._text_tokens(), check_stop=False)
        text = self.detokenizer.text
        if not finished and self.holdback:
            return text, max(0, len(text) - self.holdback)
        return text, len(text)

    def output(self) -> CompletionOutput:
        """Everything so far (``CUMULATIVE``, ``FINAL_ONLY``)."""
        seq = self.seq
        finish_reason = seq.finish_reason
        text, shown = self._shown_text(finish_reason is not None)
        return CompletionOutput(
            self.index, text[:shown], list(seq.output_token_ids), self.cumulative_logprob,
            None if self.logprobs is None else self.logprobs.view(), finish_reason,
            seq.stop_reason)

    def delta(self) -> CompletionOutput | None:
        """What is new since its last delta (``DELTA``); None: nothing."""
        seq = self.seq
        finish_reason = seq.finish_reason
        text, shown = self._shown_text(finish_reason is not None)
        return self.sent.next(self.index, text, shown, seq.output_token_ids, self.logprobs,
                              self.cumulative_logprob, finish_reason, seq.stop_reason)


@dataclass
class RequestState:
    """A request as the caller sees it: one prompt, ``n`` completions."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    completions: list[CompletionState] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    prompt_logprobs_sent: bool = False  # output_kind DELTA: given with an earlier output

    def __post_init__(self) -> None:
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]  # nothing predicts the first prompt token

    @property
    def finished(self) -> bool:
        completions = self.completions  # checked twice per request and step
        if len(completions) == 1:
            return completions[0].seq.status.is_finished
        return all(c.seq.status.is_finished for c in completions)

    def add_prompt_logprobs(self, part: PromptLogprobs, builder: LogprobsBuilder) -> None:
        """Append the positions of ``part`` not yet recorded (a recomputed prefill repeats
        them)."""
        have = len(self.prompt_logprobs)
        if part.start > have:
            return  # positions before it were never computed: keep the list contiguous
        rows = range(have - part.start, len(part.values.token_ids))
        k = self.params.prompt_logprobs
        self.prompt_logprobs.extend(builder.position(part.values, row, k, self.params.detokenize)
                                    for row in rows)

    def advance(self, now: float) -> RequestOutput | None:
        """Record that the step applied at ``now`` gave its completions tokens; what ``step``
        returns for the request now (its ``output_kind``; None: nothing yet)."""
        finished = self.finished
        metrics = self.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.last_token_time = now
        if finished:
            metrics.finished_time = now
        kind = self.params.output_kind
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = kind is RequestOutputKind.DELTA
        complete = (self.prompt_logprobs is not None
                    and len(self.prompt_logprobs) == len(self.prompt_token_ids)
                    and not (delta and self.prompt_logprobs_sent))
        prompt_logprobs = list(self.prompt_logprobs) if complete else None
        if delta:
            completions = [d for d in map(CompletionState.delta, self.completions)
                           if d is not None]
            self.prompt_logprobs_sent |= complete
        else:
            completions = [c.output() for c in self.completions]
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, completions,
                             finished, prompt_logprobs, self.metrics,
                             self.completions[0].seq.num_cached_tokens)
