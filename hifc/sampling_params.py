"""Per-request sampling parameters (vLLM's names and defaults)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing float32 logits by a
# smaller one overflows them, and the distribution is a one-hot in all but name anyway.
GREEDY_TEMPERATURE = 1e-5
# Above this every token is about equally likely; larger values (or inf) mean nothing more.
MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    temperature 0 (or below 1e-5) is greedy; it is at most 100. top_k -1 or 0 disables top-k;
    top_p 1.0 disables nucleus sampling. Generation stops at ``max_tokens`` new tokens, at an EOS
    token (unless ``ignore_eos``), at any of ``stop_token_ids`` (kept in ``token_ids``), or when
    the text contains one of ``stop`` (the text is cut before it). Values of the wrong type or out
    of range raise ValueError naming the field; token ids are checked against the model's
    vocabulary when the request is added (:meth:`check_vocab`).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        # Accept lists / a single string for convenience, store tuples (hashable, immutable).
        object.__setattr__(self, "stop", _strings("stop", self.stop))
        object.__setattr__(self, "stop_token_ids", _token_ids("stop_token_ids",
                                                              self.stop_token_ids))
        if not _is_int(self.max_tokens):
            raise ValueError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        _finite("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if self.temperature > MAX_TEMPERATURE:
            raise ValueError(f"temperature must be at most {MAX_TEMPERATURE:g}, "
                             f"got {self.temperature:g}")
        if not _is_int(self.top_k):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled), or at least 1, got "
                             f"{_short(self.top_k)}")
        _finite("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {_short(self.seed)}")
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    def check_vocab(self, vocab_size: int) -> None:
        """ValueError unless the token ids and top_k fit a vocabulary of ``vocab_size``."""
        beyond = [t for t in self.stop_token_ids if t >= vocab_size]
        if beyond:
            raise ValueError(f"stop_token_ids contains {_short(beyond[0])}, outside the "
                             f"vocabulary (0..{vocab_size - 1})")
        if self.top_k > vocab_size:
            raise ValueError(f"top_k must be at most the vocabulary size ({vocab_size}), "
                             f"got {_short(self.top_k)}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(name: str, value) -> None:
    if not isinstance(value, bool) and isinstance(value, (int, float)):
        try:
            if math.isfinite(value):
                return
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
            raise ValueError(f"{name} must be non-negative integers, got {t!r}")
    return tuple(value)
