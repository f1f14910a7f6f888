"""Per-request sampling parameters (vLLM's names and defaults)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    temperature 0 is greedy. top_k <= 0 (or -1) disables top-k; top_p 1.0 disables nucleus
    sampling. Generation stops at ``max_tokens`` new tokens, at an EOS token (unless
    ``ignore_eos``), at any of ``stop_token_ids`` (kept in ``token_ids``), or when the text
    contains one of ``stop`` (the text is cut before it).
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
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"stop_token_ids must be non-negative integers, got {t!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
