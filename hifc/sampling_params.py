"""Per-request sampling parameters (vLLM's names, defaults, ranges and messages)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from enum import IntEnum
from typing import Any

from hifc.structured.params import GuidedDecodingParams, StructuredOutputsParams

__all__ = ["SamplingParams", "RequestOutputKind", "StructuredOutputsParams",
           "GuidedDecodingParams"]

MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit bias; larger values are clamped to it
# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing float32 logits by a
# smaller one overflows them, and the distribution is a one-hot in all but name anyway.
GREEDY_TEMPERATURE = 1e-5
# Above this every token is about equally likely; larger values (or inf) mean nothing more.
MAX_TEMPERATURE = 100.0
# completions per request at most: each is a sequence of its own, built when the request is
# added, so a larger n is refused up front rather than filling memory (the server keeps
# OpenAI's lower limit)
MAX_N = 4096


class RequestOutputKind(IntEnum):
    """What ``LLMEngine.step`` returns for a request (vLLM's names and values)."""

    CUMULATIVE = 0  # after each step that advanced it: all its tokens and text so far
    DELTA = 1  # after each step that advanced it: only what is new since its last output
    FINAL_ONLY = 2  # once, when it finished: everything (``LLM.generate`` asks for this)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (vLLM's ``SamplingParams``).

    Sampling: ``temperature`` 0 (or below 1e-5) is greedy, and at most 100; ``top_k`` 0 or -1
    and ``top_p`` 1.0 disable them;
    ``min_p`` keeps tokens at least that fraction as likely as the most likely one;
    ``presence_penalty`` / ``frequency_penalty`` (in [-2, 2]) subtract a constant / the count for
    tokens already generated; ``repetition_penalty`` (> 0, 1 is off) divides positive and
    multiplies negative logits of tokens in the prompt or the output; ``logit_bias`` adds to
    single tokens' logits (clamped to +-100); ``allowed_token_ids`` restricts, ``bad_words``
    forbids words; ``structured_outputs`` (or vLLM's older ``guided_decoding``) constrains the
    text to a JSON schema, regex, choice or grammar. ``seed`` makes a request reproducible
    whatever else runs beside it; ``n`` samples that many completions of the prompt (seeds
    ``seed``, ``seed + 1``, ...).

    Stopping: at ``max_tokens`` new tokens (None: what the context leaves after the prompt), at
    an EOS token (unless ``ignore_eos``), at any of ``stop_token_ids`` (kept in the output), or
    when the text contains one of ``stop`` (cut before it, unless
    ``include_stop_str_in_output``); none of these before ``min_tokens`` tokens.

    Outputs: ``logprobs`` = k returns, per generated token, the log-probabilities of the k most
    likely tokens and of the sampled one (with ranks); ``prompt_logprobs`` = k the same for the
    prompt's tokens. Log-probabilities are those of the model's raw distribution (before
    penalties, temperature and masks), as vLLM returns by default. ``output_kind`` says when
    ``LLMEngine.step`` returns the request's output and what it holds
    (:class:`RequestOutputKind`). Until a request finishes, its outputs leave out the last
    characters of text that a stop string may still cut (:attr:`stop_holdback`), as vLLM's do.

    Values of the wrong type or out of range raise ValueError naming the field; token ids are
    checked against the model's vocabulary when the request is added (:meth:`check_vocab`).
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    bad_words: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        # lists / a single string are accepted; tuples are stored (immutable)
        self._set("stop", _strings("stop", self.stop))
        self._set("bad_words", _strings("bad_words", self.bad_words))
        self._set("stop_token_ids", _token_ids("stop_token_ids", self.stop_token_ids))
        if self.allowed_token_ids is not None:
            ids = _token_ids("allowed_token_ids", self.allowed_token_ids)
            if not ids:
                raise ValueError("allowed_token_ids must not be empty")
            self._set("allowed_token_ids", ids)
        self._set("logit_bias", _logit_bias(self.logit_bias))
        self._check_sampling()
        self._check_lengths()
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative integer, got {_short(value)}")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output",
                     "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")
        if not (_is_int(self.output_kind) and self.output_kind in tuple(RequestOutputKind)):
            raise ValueError(f"output_kind must be a RequestOutputKind (0 cumulative, 1 delta, "
                             f"2 final only), got {_short(self.output_kind)}")
        self._set("output_kind", RequestOutputKind(self.output_kind))
        self._check_structured()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_sampling(self) -> None:
        if not _is_int(self.n):
            raise ValueError(f"n must be an integer, got {_short(self.n)}")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {_short(self.n)}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = _finite(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if _finite("repetition_penalty", self.repetition_penalty) <= 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got "
                             f"{self.repetition_penalty}")
        if _finite("temperature", self.temperature) < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if self.temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be at most {MAX_TEMPERATURE:g}, "
                             f"got {self.temperature:g}")
        if not 0.0 < _finite("top_p", self.top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k):
            raise ValueError(f"top_k must be an integer, got {_short(self.top_k)}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled), or at least 1, got "
                             f"{_short(self.top_k)}")
        if not 0.0 <= _finite("min_p", self.min_p) <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {_short(self.seed)}")

    def _check_lengths(self) -> None:
        if self.max_tokens is not None:
            if not _is_int(self.max_tokens):
                raise ValueError(f"max_tokens must be an integer, got {_short(self.max_tokens)}")
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be greater than or equal to 0, got "
                             f"{_short(self.min_tokens)}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to "
                             f"max_tokens={self.max_tokens}, got {self.min_tokens}")

    def _check_structured(self) -> None:
        given = [p for p in (self.structured_outputs, self.guided_decoding) if p is not None]
        for p in given:
            if not isinstance(p, StructuredOutputsParams):
                raise ValueError("structured_outputs must be a StructuredOutputsParams")
        if len(given) == 2 and given[0] != given[1]:
            raise ValueError("give structured_outputs or guided_decoding, not both")
        if given:  # one field holds them from here on (vLLM's older name is an alias)
            self._set("structured_outputs", given[0])
            self._set("guided_decoding", None)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def stop_holdback(self) -> int:
        """Characters at the end of the text that a stop string may still cut (a stop string
        is cut out of the text, so all but its last character can already be there)."""
        if self.include_stop_str_in_output:
            return 0
        return max(map(len, self.stop), default=1) - 1

    @cached_property
    def has_penalties(self) -> bool:  # asked of every row while no row had penalties
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @cached_property
    def plain_greedy(self) -> bool:
        """Greedy with nothing else for the sampler to apply: no penalties, logit bias,
        allowed tokens, min_tokens bans or logprobs (bad words and grammars come with the
        step's constraints). Asked of every row at every step: computed once."""
        return (self.greedy and not self.has_penalties and not self.logit_bias
                and self.allowed_token_ids is None and not self.min_tokens
                and self.logprobs is None)

    def check_vocab(self, vocab_size: int) -> None:
        """ValueError unless every token id named here, and top_k, fit a vocabulary of this
        size."""
        if self.top_k > vocab_size:
            raise ValueError(f"top_k must be at most the vocabulary size ({vocab_size}), "
                             f"got {_short(self.top_k)}")
        for name in ("stop_token_ids", "allowed_token_ids"):
            beyond = [t for t in getattr(self, name) or () if t >= vocab_size]
            if beyond:
                raise ValueError(f"{name} contains {_short(beyond[0])}, outside the vocabulary "
                                 f"(0..{vocab_size - 1})")
        beyond = [t for t in self.logit_bias or {} if t >= vocab_size]
        if beyond:
            raise ValueError(f"logit_bias names token {_short(beyond[0])}, outside the "
                             f"vocabulary (0..{vocab_size - 1})")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(name: str, value) -> float:
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            if math.isfinite(value):
                return float(value)
        except OverflowError:  # an int too large for a float
            pass
    raise ValueError(f"{name} must be a finite number, got {_short(value)}")


def _short(value) -> str:
    """repr of a value; an integer too long to read is described by its size."""
    if _is_int(value) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _strings(name: str, value) -> tuple[str, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"{name} must be a string or a list of strings, got "
                         f"{type(value).__name__}")
    for s in items:
        if not isinstance(s, str) or not s:
            raise ValueError(f"{name} strings must be non-empty strings, got {s!r}")
    return tuple(items)


def _token_ids(name: str, value) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of token ids, got {type(value).__name__}")
    for t in value:
        if not _is_int(t) or t < 0:
            raise ValueError(f"{name} must be non-negative integers, got {_short(t)}")
    return tuple(value)


def _logit_bias(value) -> dict[int, float] | None:
    """{token id: bias}; keys may be ints or their decimal strings (as JSON sends them)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got "
                         f"{type(value).__name__}")
    bias = {}
    for key, b in value.items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if not _is_int(token) or token < 0:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        b = _finite(f"logit_bias[{key!r}]", b)
        bias[token] = max(-MAX_LOGIT_BIAS, min(MAX_LOGIT_BIAS, b))
    return bias
