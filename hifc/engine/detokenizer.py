"""Incremental detokenization and stop-string detection for one request."""
from __future__ import annotations

from hifc.loader.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, emitting only complete characters.

    Decodes a small window (from ``prefix_offset``) so the cost per token stays constant and
    tokenizers that change a word's leading space in context stay correct.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool, stop: tuple[str, ...],
                 include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self.include_stop_str_in_output = include_stop_str_in_output
        self.text = ""
        self._prefix_offset = 0
        self._read_offset = 0
        self._max_stop_len = max((len(s) for s in stop), default=0)

    def update(self, token_ids: list[int], check_stop: bool = True) -> str | None:
        """Extend ``text`` with the new tokens of ``token_ids``; returns the stop string that
        ended the text (cut before it, or after it with ``include_stop_str_in_output``), if
        any. ``check_stop`` False (before ``min_tokens``): the new text is not searched."""
        decode = self.tokenizer.decode
        prefix = decode(token_ids[self._prefix_offset:self._read_offset], self.skip_special_tokens)
        full = decode(token_ids[self._prefix_offset:], self.skip_special_tokens)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None  # no complete new character yet
        delta = full[len(prefix):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(token_ids)
        search_from = max(0, len(self.text) - self._max_stop_len + 1)
        self.text += delta
        return self._cut_at_stop(search_from) if check_stop and self.stop else None

    def _cut_at_stop(self, search_from: int) -> str | None:
        hits = [(i, s) for i, s in ((self.text.find(s, search_from), s) for s in self.stop)
                if i >= 0]
        if not hits:
            return None
        index, stop = min(hits)
        self.text = self.text[:index + len(stop) if self.include_stop_str_in_output else index]
        return stop
