"""LLM: the offline batch API (``LLM(model).generate(prompts, params)``)."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from tqdm.auto import tqdm

from hifc.config import EngineConfig
from hifc.engine.gc_heap import frozen_heap
from hifc.engine.outputs import RequestOutput
from hifc.loader.chat import normalize_conversation
from hifc.parallel.data_parallel import build_engine
from hifc.sampling_params import RequestOutputKind, SamplingParams

# a string, token ids, or vLLM's prompt dicts {"prompt": str} / {"prompt_token_ids": [...]}
Prompt = str | list[int] | dict
Message = dict[str, Any]


def _as_prompt_list(prompts) -> list[str | list[int]]:
    """One prompt (a string, token ids or a prompt dict) or a list of prompts, as a list of
    strings and token-id lists."""
    if isinstance(prompts, (str, dict)) or _is_token_ids(prompts):
        return [_prompt(prompts, "prompts")]
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be a string, a list of token ids, or a list of those, "
                         f"got {type(prompts).__name__}")
    return [_prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


def _prompt(prompt, where: str) -> str | list[int]:
    """A string or token ids (the engine checks what they hold), from vLLM's prompt dicts too."""
    if isinstance(prompt, dict):
        keys = set(prompt)
        if keys == {"prompt"}:
            prompt = prompt["prompt"]
        elif keys == {"prompt_token_ids"}:
            prompt = prompt["prompt_token_ids"]
        else:
            raise ValueError(f"a prompt dict holds either 'prompt' (text) or 'prompt_token_ids'; "
                             f"got keys {sorted(keys)}")
    if not isinstance(prompt, (str, list, tuple)):
        raise ValueError(f"{where} must be a string or a list of token ids, got "
                         f"{type(prompt).__name__}")
    return prompt if isinstance(prompt, str) else list(prompt)


def _is_token_ids(value) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def _params_list(sampling_params, num_prompts: int) -> list[SamplingParams]:
    """One SamplingParams per prompt (the same one for all, or a list of them)."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params or SamplingParams()] * num_prompts
    if not isinstance(sampling_params, (list, tuple)):
        raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got "
                         f"{type(sampling_params).__name__}")
    if len(sampling_params) != num_prompts:
        raise ValueError(f"got {len(sampling_params)} sampling params for {num_prompts} prompts")
    return list(sampling_params)


class LLM:
    """Batch generation over an ``LLMEngine``, or over data-parallel replicas of one
    (``data_parallel_size``). Options are ``EngineConfig``'s (vLLM names)."""

    def __init__(self, model: str | None = None, **engine_options):
        self.engine = build_engine(EngineConfig.from_options(model, **engine_options))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def stats(self) -> dict[str, float | int]:
        return self.engine.stats()

    def close(self) -> None:
        """Wait for swap I/O in flight and release the swap tier (the flash file stays); stop
        the replica processes, if any."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for one prompt or a list (strings, token ids, or vLLM's prompt dicts).
        Every request's output is built once, when it finishes (``output_kind`` FINAL_ONLY,
        as vLLM's ``LLM`` asks)."""
        prompt_list = _as_prompt_list(prompts)
        params = _params_list(sampling_params, len(prompt_list))
        # Validate everything before queueing anything, so bad input loses nothing (each
        # distinct object once: a list often repeats one).
        distinct = {id(p): p for p in params}
        for p in distinct.values():
            self.engine.check_sampling_params(p)
        final_only = {i: dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
                      for i, p in distinct.items()}
        params = [final_only[id(p)] for p in params]
        token_prompts = [self.engine.tokenize_prompt(p) for p in prompt_list]
        order = []
        try:
            for prompt, ids, p in zip(prompt_list, token_prompts, params):
                request_id = f"gen-{next(self._ids)}"
                self.engine.add_request(request_id, prompt, p, prompt_ids=ids)
                order.append(request_id)
        except ValueError:  # a check that needs the prompt and the pool (length, KV blocks)
            self.engine.abort_request(order)
            raise
        return self._run(order, use_tqdm)

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        """Apply the chat template (the model's, or ``chat_template``) to one conversation or a
        list of them, then generate. Message contents may be text or lists of text parts;
        ``continue_final_message`` continues the last (assistant) message instead of starting
        a new one."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list of messages (dicts) or of "
                             "conversations (lists of messages)")
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError(f"model {self.engine.model_name!r} has no tokenizer or chat template")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        prompts = [tokenizer.apply_chat_template(
            normalize_conversation(c), add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Generating", unit="req", disable=not use_tqdm)
        try:
            with frozen_heap(collect=False):  # no full collection walks the start-up state
                while self.engine.has_unfinished_requests():
                    for output in self.engine.step():
                        if output.finished:
                            finished[output.request_id] = output
                            bar.update(1)
        except BaseException:
            self.engine.abort_request([r for r in order if r not in finished])
            raise
        finally:
            bar.close()
        return [finished[r] for r in order]
