"""Request validation shared by every engine front end: text or token ids -> checked token
ids, and sampling parameters checked against the model's vocabulary."""
from __future__ import annotations

from hifc.loader.tokenizer import Tokenizer
from hifc.sampling_params import SamplingParams


def tokenize_prompt(prompt: str | list[int], tokenizer: Tokenizer | None, vocab_size: int,
                    max_model_len: int, model_name: str) -> list[int]:
    """The prompt's token ids; a clear ValueError for an empty, unencodable, out-of-vocabulary
    or too long prompt."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        if tokenizer is None:
            raise ValueError(f"model {model_name!r} has no tokenizer: pass token ids")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)):
        ids = list(prompt)
        if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise ValueError("prompt token ids must be integers")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary "
                             f"(0..{vocab_size - 1})")
    else:
        raise ValueError(f"prompt must be a string or a list of token ids, got "
                         f"{type(prompt).__name__}")
    if not ids:
        raise ValueError("prompt is empty")
    if len(ids) >= max_model_len:
        raise ValueError(f"prompt is {len(ids)} tokens long; the maximum model length is "
                         f"{max_model_len} (prompt plus at least one new token)")
    return ids


def check_sampling_params(params, vocab_size: int) -> SamplingParams:
    """``params`` if it is a SamplingParams that fits the vocabulary; else a clear ValueError."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
    params.check_vocab(vocab_size)
    return params
