"""Turns the sampler's log-probability rows into vLLM's per-position dicts of ``Logprob``."""
from __future__ import annotations

from hifc.core.outputs import TopLogprobs
from hifc.engine.outputs import Logprob, PositionLogprobs
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
        text = self.token_text if decode else (lambda _: None)
        chosen = values.token_ids[row]
        entries = {chosen: Logprob(values.logprobs[row], values.ranks[row], text(chosen))}
        top = zip(values.top_ids[row][:k], values.top_logprobs[row][:k])
        for rank, (token, logprob) in enumerate(top, start=1):
            if token not in entries:
                entries[token] = Logprob(logprob, rank, text(token))
        return entries

    def positions(self, values: TopLogprobs, k: int, decode: bool = True
                  ) -> list[PositionLogprobs]:
        return [self.position(values, row, k, decode) for row in range(len(values.token_ids))]
