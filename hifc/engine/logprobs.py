"""Turns the sampler's log-probability rows into vLLM's per-position dicts of ``Logprob``, with
each token's text."""
from __future__ import annotations

from hifc.core.outputs import TopLogprobs
from hifc.engine.outputs import PositionLogprobs, position_logprobs
from hifc.loader.tokenizer import Tokenizer


class LogprobsBuilder:
    """Builds ``{token id: Logprob}`` per position, with each token's text (decoded alone, as
    vLLM does; None without a tokenizer). Token texts are cached: the vocabulary is finite."""

    def __init__(self, tokenizer: Tokenizer | None):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str | None:
        if self._tokenizer is None:
            return None
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._tokenizer.decode([token_id],
                                                                  skip_special_tokens=False)
        return text

    def position(self, values: TopLogprobs, row: int, k: int,
                 decode: bool = True) -> PositionLogprobs:
        """Row ``row`` of ``values``: its chosen token first, then the k most likely tokens."""
        return position_logprobs(values.token_ids[row], values.logprobs[row], values.ranks[row],
                                 values.top_ids[row][:k], values.top_logprobs[row][:k],
                                 self.token_text if decode else None)
