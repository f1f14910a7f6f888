"""Words a request must not generate (vLLM's ``bad_words``), as token sequences."""
from __future__ import annotations

from hifc.loader.tokenizer import Tokenizer


class BadWords:
    """The token sequences of each word, alone and after a space (a word tokenizes differently
    at the start of the text and after a space). A one-token word is never generated; a longer
    one's last token is banned whenever the output ends with the tokens before it."""

    def __init__(self, words: tuple[str, ...], tokenizer: Tokenizer):
        sequences = set()
        for word in words:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = tuple(tokenizer.encode(text, add_special_tokens=False))
                if ids:
                    sequences.add(ids)
        self.always: tuple[int, ...] = tuple(sorted({s[0] for s in sequences if len(s) == 1}))
        self.after_prefix: tuple[tuple[int, ...], ...] = tuple(
            sorted(s for s in sequences if len(s) > 1))

    def banned_next(self, output_token_ids: list[int]) -> list[int]:
        """The tokens banned as the next token after ``output_token_ids``."""
        banned = list(self.always)
        for seq in self.after_prefix:
            prefix = seq[:-1]
            if tuple(output_token_ids[-len(prefix):]) == prefix:
                banned.append(seq[-1])
        return banned
