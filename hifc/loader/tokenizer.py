"""Tokenizer: a thin wrapper around a transformers fast tokenizer, with the model's eos ids."""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

from jinja2 import TemplateError

try:  # tokenizers >= 0.21
    from tokenizers.decoders import DecodeStream
except ImportError:  # older tokenizers: window decoding only
    DecodeStream = None

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def has_tokenizer(model_dir: Path) -> bool:
    return any((model_dir / name).is_file() for name in _TOKENIZER_FILES)


class Tokenizer:
    """Encode/decode text and render chat prompts for one model."""

    def __init__(self, hf_tokenizer: Any, extra_eos_ids: Iterable[int] = ()):
        """hf_tokenizer: a transformers tokenizer; extra_eos_ids: eos ids from the model's
        generation config or GGUF metadata, added to the tokenizer's own eos."""
        self.hf_tokenizer = hf_tokenizer
        eos = set(int(i) for i in extra_eos_ids)
        if hf_tokenizer.eos_token_id is not None:
            eos.add(int(hf_tokenizer.eos_token_id))
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self._backend_decode = _backend_decode(hf_tokenizer)

    @classmethod
    def from_model_dir(cls, model_dir: Path, extra_eos_ids: Iterable[int] = ()) -> "Tokenizer":
        """The tokenizer saved in a Hugging Face model directory (never downloads)."""
        from transformers import AutoTokenizer
        try:
            hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot load the tokenizer of {model_dir}: {exc}") from exc
        return cls(hf, extra_eos_ids)

    @classmethod
    def from_gguf(cls, path: Path, extra_eos_ids: Iterable[int] = ()) -> "Tokenizer":
        """The tokenizer and chat template stored in a GGUF file's metadata."""
        from transformers import PreTrainedTokenizerFast
        try:
            hf = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"cannot build a tokenizer from {path}: {exc}") from exc
        return cls(hf, extra_eos_ids)

    @property
    def bos_token_id(self) -> int | None:
        return self.hf_tokenizer.bos_token_id

    @property
    def vocab_size(self) -> int:
        """Number of tokens, added tokens included."""
        return len(self.hf_tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf_tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """transformers' ``decode``; through the fast tokenizer's own decoder where transformers
        adds nothing to it (2.2 against 7.5 us per generated token on a 2-core CPU, the
        incremental detokenizer's two decodes: docs/RESULTS.md)."""
        if self._backend_decode is not None:
            return self._backend_decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = True
                      ) -> Callable[[int], str | None] | None:
        """A function that takes the next token id of a text decoded from its start and
        returns the characters it completes (None: none yet), as ``decode`` would give them;
        the fast tokenizer's ``DecodeStream`` does the work (the incremental detokenizer takes
        1.1-1.3 us per token so, 1.7-1.8 with two window decodes, on a 2-core CPU). None where
        ``decode`` goes through transformers or tokenizers has no ``DecodeStream``."""
        if self._backend_decode is None or DecodeStream is None:
            return None
        stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        backend = self.hf_tokenizer.backend_tokenizer
        return partial(stream.step, backend)  # no Python frame per token, as a lambda has

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            chat_template: str | None = None,
                            chat_template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text for a chat; ValueError if there is no template or it fails.

        continue_final_message: end the prompt inside the last (assistant) message, so that
        generation continues it; chat_template: a Jinja template replacing the model's;
        chat_template_kwargs: extra variables the template reads."""
        if add_generation_prompt and continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message cannot both be "
                             "true")
        if not (chat_template or getattr(self.hf_tokenizer, "chat_template", None)):
            raise ValueError("this model's tokenizer has no chat template")
        try:
            return self.hf_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template=chat_template,
                **(chat_template_kwargs or {}))
        except (TemplateError, TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"chat template failed on these messages: {exc}") from exc


def _backend_decode(hf_tokenizer: Any):
    """The fast tokenizer's own ``decode`` where transformers' returns its text unchanged (no
    clean-up of spaces; transformers skips that for BPE models), else None."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(hf_tokenizer, "is_fast", False):
        return None
    # transformers versions that skip the clean-up for BPE models have this switch
    bpe_skip = getattr(hf_tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_"
                                     "corrupt_output", None) is False
    cleans_up = bool(getattr(hf_tokenizer, "clean_up_tokenization_spaces", False)) and not (
        bpe_skip and type(backend.model).__name__ == "BPE")
    return None if cleans_up else backend.decode
