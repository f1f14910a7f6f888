"""Pieces of OpenAI responses: choices, log-probabilities and usage."""
from __future__ import annotations

from typing import Callable

from hifc.engine.outputs import PositionLogprobs

LOGPROB_FLOOR = -9999.0  # OpenAI's stand-in for -inf (JSON has no infinity)

TokenText = Callable[[int], str]


def _lp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def completion_logprobs(token_ids: list[int], positions: list[PositionLogprobs | None],
                        token_text: TokenText, initial_offset: int = 0) -> dict:
    """The ``logprobs`` of a /v1/completions choice: per token its text, logprob, the top
    tokens' {text: logprob} (the chosen token and the top k) and its offset in the text.
    Positions without logprobs (the first prompt token) are null."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = initial_offset
    for token, position in zip(token_ids, positions):
        text = token_text(token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if position is None:
            token_logprobs.append(None)
            top.append(None)
        else:
            token_logprobs.append(_lp(position[token].logprob))
            top.append({token_text(t): _lp(lp.logprob) for t, lp in position.items()})
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens,
            "top_logprobs": top}


def chat_logprobs(token_ids: list[int], positions: list[PositionLogprobs],
                  token_text: TokenText, top_k: int) -> dict:
    """The ``logprobs`` of a chat choice: ``{"content": [{token, logprob, bytes,
    top_logprobs: [the top_k most likely, best first]}]}``."""
    content = []
    for token, position in zip(token_ids, positions):
        ranked = sorted(position.items(), key=lambda e: e[1].rank or 0)[:top_k]
        content.append({**_chat_entry(token_text(token), position[token].logprob),
                        "top_logprobs": [_chat_entry(token_text(t), lp.logprob)
                                         for t, lp in ranked]})
    return {"content": content}


def prompt_logprobs(positions: list[PositionLogprobs | None] | None) -> list | None:
    """vLLM's ``prompt_logprobs``: per prompt token null (the first) or {token id: {logprob,
    rank, decoded_token}}."""
    if positions is None:
        return None
    return [None if p is None else
            {str(t): {"logprob": _lp(lp.logprob), "rank": lp.rank,
                      "decoded_token": lp.decoded_token} for t, lp in p.items()}
            for p in positions]


def _chat_entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": _lp(logprob), "bytes": list(text.encode("utf-8"))}


def completion_choice(index: int, text: str, logprobs: dict | None, finish_reason: str | None,
                      stop_reason: int | str | None, prompt_logprobs: list | None = None,
                      token_ids: list[int] | None = None,
                      prompt_token_ids: list[int] | None = None) -> dict:
    """``token_ids`` (the generated ids, or a stream chunk's new ones) and
    ``prompt_token_ids``: vLLM's ``return_token_ids`` extras, present when not None."""
    choice = {"index": index, "text": text, "logprobs": logprobs,
              "finish_reason": finish_reason, "stop_reason": stop_reason}
    if prompt_logprobs is not None:  # vLLM's extra, when asked for
        choice["prompt_logprobs"] = prompt_logprobs
    return _with_token_ids(choice, token_ids, prompt_token_ids)


def chat_choice(index: int, text: str | None, logprobs: dict | None, finish_reason: str | None,
                stop_reason: int | str | None, delta: bool, role: bool = False,
                token_ids: list[int] | None = None) -> dict:
    """A chat choice: ``message`` (whole response) or ``delta`` (a stream chunk; ``role``
    only in a choice's first chunk). ``token_ids``: as in :func:`completion_choice` (a chat
    response carries ``prompt_token_ids`` at its top level)."""
    message = {} if text is None else {"content": text}
    if role or not delta:
        message["role"] = "assistant"
    choice = {"index": index, "delta" if delta else "message": message, "logprobs": logprobs,
              "finish_reason": finish_reason, "stop_reason": stop_reason}
    return _with_token_ids(choice, token_ids, None)


def _with_token_ids(choice: dict, token_ids: list[int] | None,
                    prompt_token_ids: list[int] | None) -> dict:
    if prompt_token_ids is not None:
        choice["prompt_token_ids"] = list(prompt_token_ids)
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return choice


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """``cached_tokens``: prompt tokens found in the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
