"""Request validation shared by every engine front end: text or token ids -> checked token
ids, sampling parameters checked against the model's vocabulary, and what a request's length
leaves to generate."""
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


def check_sampling_params(params, vocab_size: int, max_logprobs: int,
                          tokenizer: Tokenizer | None, model_name: str) -> SamplingParams:
    """``params`` if this model can serve it (a SamplingParams, token ids and top_k inside the
    vocabulary, logprobs within ``max_logprobs``, a tokenizer where one is needed); else a clear
    ValueError. Grammars are compiled (and so checked) by the engine that runs them."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
    params.check_vocab(vocab_size)
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name)
        if k is not None and k > max_logprobs:
            raise ValueError(f"requested {name} of {k}, which is greater than the maximum "
                             f"allowed: {max_logprobs} (max_logprobs)")
    needs_tokenizer = [name for name in ("bad_words", "structured_outputs") if getattr(params, name)]
    if needs_tokenizer and tokenizer is None:
        raise ValueError(f"{needs_tokenizer[0]} needs a tokenizer; model {model_name!r} has none")
    return params


def resolve_max_tokens(params: SamplingParams, prompt_len: int, max_model_len: int) -> int:
    """The request's ``max_tokens`` (None: what the context leaves after the prompt); a clear
    ValueError when that leaves less than ``min_tokens``."""
    if params.max_tokens is not None:
        return params.max_tokens
    max_tokens = max_model_len - prompt_len
    if params.min_tokens > max_tokens:
        raise ValueError(f"min_tokens ({params.min_tokens}) exceeds what the context leaves "
                         f"after the prompt ({max_tokens} tokens)")
    return max_tokens


def stop_token_ids(tokenizer: Tokenizer | None, arch) -> frozenset[int]:
    """The ids that end a sequence: the tokenizer's end-of-sequence ids, else the model's."""
    return frozenset(tokenizer.eos_token_ids if tokenizer else arch.eos_token_ids)
