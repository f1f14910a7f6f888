"""Incremental detokenization and stop-string detection for one request."""
from __future__ import annotations

from hifc.loader.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, emitting only complete characters.

    Decodes a small window (from ``prefix_offset``) so the cost per token stays constant and
    tokenizers that change a word's leading space in context stay correct.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool, stop: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0
        self._max_stop_len = max((len(s) for s in stop), default=0)

    def update(self, token_ids: list[int]) -> bool:
        """Extend ``text`` with the new tokens of ``token_ids``; True if a stop string ended it."""
        decode = self.tokenizer.decode
        prefix = decode(token_ids[self._prefix_offset:self._read_offset], self.skip_special_tokens)
        full = decode(token_ids[self._prefix_offset:], self.skip_special_tokens)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False  # no complete new character yet
        delta = full[len(prefix):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(token_ids)
        search_from = max(0, len(self.text) - self._max_stop_len + 1)
        self.text += delta
        return self._cut_at_stop(search_from)

    def _cut_at_stop(self, search_from: int) -> bool:
        hits = [i for i in (self.text.find(s, search_from) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[:min(hits)]
        return True
