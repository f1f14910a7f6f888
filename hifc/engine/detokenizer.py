"""Incremental detokenization and stop-string detection for one request."""
from __future__ import annotations

from hifc.loader.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, emitting only complete characters.

    Through the tokenizer's decode stream where it has one (``Tokenizer.decode_stream``), else
    by decoding a small window (from ``prefix_offset``) twice per token, so the cost per token
    stays constant and tokenizers that change a word's leading space in context stay correct.
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
        self._stream = tokenizer.decode_stream(skip_special_tokens)
        self._num_seen = 0  # tokens taken (into the stream, or past the windows)

    def update(self, token_ids: list[int], check_stop: bool = True) -> str | None:
        """Extend ``text`` with the new tokens of ``token_ids`` (usually one; several are
        taken one at a time, with the text they would have given one per call); returns the
        stop string that ended the text (cut before it, or after it with
        ``include_stop_str_in_output``), if any. ``check_stop`` False (before ``min_tokens``):
        the new text is not searched."""
        delta = self._streamed(token_ids) if self._stream else self._windows(token_ids)
        if not delta:
            return None  # no complete new character yet
        search_from = max(0, len(self.text) - self._max_stop_len + 1)
        self.text += delta
        return self._cut_at_stop(search_from) if check_stop and self.stop else None

    def _streamed(self, token_ids: list[int]) -> str:
        text = ""
        for i in range(self._num_seen, len(token_ids)):
            try:
                part = self._stream(token_ids[i])
            except Exception as exc:  # tokenizers raises a bare Exception
                if "Invalid prefix" not in str(exc):
                    raise
                # the stream's state broke on a text that does not grow monotonically (byte
                # fallback): go on by windows, from where they would be after these tokens
                return text + self._leave_stream(token_ids, i)
            if part:
                text += part
        self._num_seen = len(token_ids)
        return text

    def _leave_stream(self, token_ids: list[int], num_streamed: int) -> str:
        """Window decoding from now on; the windows are replayed over the ``num_streamed``
        tokens the stream took, whose text it gave."""
        self._stream = None
        self._num_seen = 0
        self._windows(token_ids[:num_streamed])  # their text is the stream's
        return self._windows(token_ids)

    def _windows(self, token_ids: list[int]) -> str:
        text = "".join(self._window_delta(token_ids, end)
                       for end in range(self._num_seen + 1, len(token_ids) + 1))
        self._num_seen = len(token_ids)
        return text

    def _window_delta(self, token_ids: list[int], end: int) -> str:
        """The text token ``end - 1`` completes, decoding the window before it and with it."""
        decode = self.tokenizer.decode
        prefix = decode(token_ids[self._prefix_offset:self._read_offset], self.skip_special_tokens)
        full = decode(token_ids[self._prefix_offset:end], self.skip_special_tokens)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = end
        return full[len(prefix):]

    def _cut_at_stop(self, search_from: int) -> str | None:
        hits = [(i, s) for i, s in ((self.text.find(s, search_from), s) for s in self.stop)
                if i >= 0]
        if not hits:
            return None
        index, stop = min(hits)
        self.text = self.text[:index + len(stop) if self.include_stop_str_in_output else index]
        return stop
