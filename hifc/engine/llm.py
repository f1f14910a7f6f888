"""LLM: the offline batch API (``LLM(model).generate(prompts, params)``)."""
from __future__ import annotations

import itertools
from collections.abc import Sequence as Seq

from tqdm.auto import tqdm

from hifc.config import EngineConfig
from hifc.engine.outputs import RequestOutput
from hifc.parallel.data_parallel import build_engine
from hifc.sampling_params import SamplingParams

Prompt = str | list[int]
Message = dict[str, str]


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Seq) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]  # one prompt given as token ids
    if isinstance(prompts, Seq):
        return [p if isinstance(p, str) else list(p) for p in prompts]
    raise ValueError("prompts must be a string, a list of token ids, or a list of those")


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
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params = list(sampling_params)
            if len(params) != len(prompt_list):
                raise ValueError(f"got {len(params)} sampling params for {len(prompt_list)} prompts")
        # Validate everything before queueing anything, so bad input loses nothing.
        token_prompts = [self.engine.tokenize_prompt(p) for p in prompt_list]
        order = []
        for prompt, ids, p in zip(prompt_list, token_prompts, params):
            request_id = f"gen-{next(self._ids)}"
            self.engine.add_request(request_id, prompt, p, prompt_ids=ids)
            order.append(request_id)
        return self._run(order, use_tqdm)

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError(f"model {self.engine.model_name!r} has no tokenizer or chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if not conversations:
            raise ValueError("messages are empty")
        for conv in conversations:
            _validate_messages(conv)
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Generating", unit="req", disable=not use_tqdm)
        try:
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


def _validate_messages(conv) -> None:
    if not isinstance(conv, list) or not conv:
        raise ValueError("a conversation must be a non-empty list of messages")
    for m in conv:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            raise ValueError("each message must be a dict with string 'role' and 'content'")
