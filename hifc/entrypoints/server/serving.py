"""Completions and chat completions: request -> engine streams -> OpenAI response or SSE.

A completions request may hold several prompts; each is one engine request of ``n``
completions, and choice ``i * n + j`` is prompt i's completion j (OpenAI's order).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from hifc.engine.outputs import CompletionOutput, RequestOutput
from hifc.entrypoints.server import responses
from hifc.entrypoints.server.async_engine import (AsyncEngine, EngineDeadError, GenerateRequest,
                                                  RequestStream)
from hifc.entrypoints.server.errors import APIError, error_body
from hifc.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest
from hifc.sampling_params import SamplingParams


@dataclass(frozen=True)
class _Call:
    """What shapes one response: the endpoint, its ids, and what the choices carry."""
    chat: bool
    response_id: str
    model: str
    created: int
    include_usage: bool
    n: int
    logprobs: int | None  # top log-probabilities per token in the response (None: none)
    echo: bool = False  # completions: the prompt precedes each choice's text
    return_token_ids: bool = False  # vLLM's extra: choices carry token_ids, prompt_token_ids


async def create_completion(engine: AsyncEngine, body: CompletionRequest, request: Request):
    body.check_supported()
    echo_logprobs = body.logprobs if body.echo else None
    params = _sampling_params(body, body.max_tokens, body.logprobs, echo_logprobs)
    call = _new_call(body, params, chat=False, logprobs=body.logprobs, echo=bool(body.echo))
    streams = await _submit(engine, [GenerateRequest(f"{call.response_id}-{i}", prompt, params)
                                     for i, prompt in enumerate(body.prompts)])
    return await _respond(engine, streams, call, bool(body.stream), request)


async def create_chat_completion(engine: AsyncEngine, body: ChatCompletionRequest,
                                 request: Request, chat_template: str | None = None):
    """``chat_template``: the server's template (``--chat-template``), replacing the
    model's unless the request brings its own."""
    body.check_supported()
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise APIError(400, f"model {body.model!r} has no tokenizer or chat template: use "
                            "/v1/completions with token ids", param="messages")
    try:
        prompt = tokenizer.apply_chat_template(
            body.conversation(), add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            chat_template=body.chat_template or chat_template,
            chat_template_kwargs=body.chat_template_kwargs)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None
    params = _sampling_params(body, body.requested_max_tokens, body.num_logprobs)
    call = _new_call(body, params, chat=True, logprobs=body.num_logprobs)
    streams = await _submit(engine, [GenerateRequest(call.response_id, prompt, params)])
    return await _respond(engine, streams, call, bool(body.stream), request)


def _sampling_params(body, max_tokens: int | None, logprobs: int | None,
                     prompt_logprobs: int | None = None) -> SamplingParams:
    try:
        return body.sampling_params(max_tokens, logprobs, prompt_logprobs)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def _new_call(body, params: SamplingParams, chat: bool, logprobs: int | None,
              echo: bool = False) -> _Call:
    prefix = "chatcmpl" if chat else "cmpl"
    return _Call(chat, f"{prefix}-{uuid.uuid4().hex}", body.model, int(time.time()),
                 body.include_usage, params.n, logprobs, echo,
                 bool(body.return_token_ids))


async def _submit(engine: AsyncEngine, requests: list[GenerateRequest]) -> list[RequestStream]:
    try:
        return await engine.submit(requests)
    except ValueError as exc:  # bad prompt or parameters: empty, too long, bad schema, ...
        raise APIError(400, str(exc), param="prompt" if "prompt" in str(exc) else None) from None
    except EngineDeadError as exc:
        raise APIError(503, str(exc)) from None


# ---- whole responses ----------------------------------------------------------------------
async def _respond(engine: AsyncEngine, streams: list[RequestStream], call: _Call,
                   streaming: bool, request: Request):
    if streaming:
        return _AbortingStreamingResponse(streams, _sse(engine, streams, call))
    finals = await _collect_unless_disconnected(streams, request)
    if finals is None:  # the client left; its requests were aborted
        return JSONResponse(error_body(499, "client disconnected"), status_code=499)
    choices = [_final_choice(engine, call, out, completion, i * call.n + completion.index)
               for i, out in enumerate(finals) for completion in out.outputs]
    generated = sum(len(c.token_ids) for out in finals for c in out.outputs)
    body = {**_envelope(call, choices, chunk=False), "usage": _usage(finals, generated)}
    if call.chat and finals[0].prompt_logprobs is not None:  # vLLM's extra, when asked for
        body["prompt_logprobs"] = responses.prompt_logprobs(finals[0].prompt_logprobs)
    if call.chat and call.return_token_ids:
        body["prompt_token_ids"] = list(finals[0].prompt_token_ids)
    return JSONResponse(body)


def _final_choice(engine: AsyncEngine, call: _Call, out: RequestOutput,
                  completion: CompletionOutput, index: int) -> dict:
    if call.chat:
        logprobs = (None if call.logprobs is None else responses.chat_logprobs(
            completion.token_ids, completion.logprobs, engine.token_text, call.logprobs))
        return responses.chat_choice(index, completion.text, logprobs, completion.finish_reason,
                                     completion.stop_reason, delta=False,
                                     token_ids=_if_asked(call, completion.token_ids))
    token_ids, positions, text = completion.token_ids, completion.logprobs, completion.text
    if call.echo:
        text = _prompt_text(engine, out) + text
        token_ids = out.prompt_token_ids + token_ids
        positions = (None if positions is None else
                     (out.prompt_logprobs or [None] * len(out.prompt_token_ids))
                     + list(positions))
    logprobs = (None if call.logprobs is None else
                responses.completion_logprobs(token_ids, positions, engine.token_text))
    return responses.completion_choice(index, text, logprobs, completion.finish_reason,
                                       completion.stop_reason,
                                       responses.prompt_logprobs(out.prompt_logprobs),
                                       token_ids=_if_asked(call, completion.token_ids),
                                       prompt_token_ids=_if_asked(call, out.prompt_token_ids))


def _if_asked(call: _Call, token_ids: Sequence[int]) -> list[int] | None:
    """``token_ids`` if the request asked for ids (``return_token_ids``), else None."""
    return list(token_ids) if call.return_token_ids else None


def _prompt_text(engine: AsyncEngine, out: RequestOutput) -> str:
    if out.prompt is not None:
        return out.prompt
    if engine.tokenizer is not None:
        return engine.tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
    return "".join(map(engine.token_text, out.prompt_token_ids))


def _usage(finals: list[RequestOutput], generated: int) -> dict:
    """``finals``: each prompt's last output; ``generated``: tokens of all its choices."""
    return responses.usage(sum(len(o.prompt_token_ids) for o in finals), generated,
                           sum(o.num_cached_tokens or 0 for o in finals))


def _envelope(call: _Call, choices: list[dict], chunk: bool) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if call.chat \
        else "text_completion"
    return {"id": call.response_id, "object": obj, "created": call.created, "model": call.model,
            "choices": choices}


async def _collect_unless_disconnected(streams: list[RequestStream],
                                       request: Request) -> list[RequestOutput] | None:
    """The final outputs, or None (requests aborted) if the client disconnects first."""
    async def last_outputs() -> list[RequestOutput]:
        finals = []
        for stream in streams:
            final = None
            async for out in stream:
                final = out
            finals.append(final)
        return finals

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    consume = asyncio.ensure_future(last_outputs())
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({consume, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not consume.done():
            return None
        try:
            return consume.result()
        except EngineDeadError as exc:
            raise APIError(503, str(exc)) from None
    finally:
        for task in (consume, watch):
            task.cancel()
        for stream in streams:
            stream.abort()


# ---- server-sent events -------------------------------------------------------------------
class _AbortingStreamingResponse(StreamingResponse):
    """Server-sent events that abort the requests however the response ends (finished, client
    gone before or during the stream, server shutting down)."""

    def __init__(self, streams: list[RequestStream], events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._streams = streams

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self._streams:
                stream.abort()


@dataclass
class _Sent:
    """How much of one choice has been streamed."""
    chars: int = 0
    tokens: int = 0  # tokens generated so far (the usage counts them)
    started: bool = False
    finished: bool = False


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) from several streams as the outputs arrive."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as exc:  # EngineDeadError: re-raised by the consumer
            queue.put_nowait((index, exc))
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def _sse(engine: AsyncEngine, streams: list[RequestStream],
               call: _Call) -> AsyncIterator[str]:
    """Server-sent events from the requests' ``DELTA`` outputs (wrapped in
    :class:`_AbortingStreamingResponse`, which aborts the requests however the stream ends)."""
    sent: dict[int, _Sent] = {}
    finals: dict[int, RequestOutput] = {}
    prompt_logprobs: dict[int, list] = {}  # by stream: a DELTA output gives them once
    try:
        async for stream_index, out in _merged(streams):
            finals[stream_index] = out
            if out.prompt_logprobs is not None:
                prompt_logprobs[stream_index] = out.prompt_logprobs
            for completion in out.outputs:
                index = stream_index * call.n + completion.index
                for payload in _deltas(engine, call, out, prompt_logprobs.get(stream_index),
                                       completion, index, sent.setdefault(index, _Sent())):
                    yield _event(payload)
    except EngineDeadError as exc:
        yield _event(error_body(503, str(exc)))
        yield "data: [DONE]\n\n"
        return
    if call.include_usage:
        ordered = [finals[i] for i in sorted(finals)]
        usage = _usage(ordered, sum(s.tokens for s in sent.values()))
        yield _event({**_envelope(call, [], chunk=True), "usage": usage})
    yield "data: [DONE]\n\n"


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _deltas(engine: AsyncEngine, call: _Call, out: RequestOutput, prompt_logprobs: list | None,
            completion: CompletionOutput, index: int, sent: _Sent) -> list[dict]:
    """The chunks of one choice's ``DELTA`` (``completion``: what is new in it). With
    ``return_token_ids`` new tokens make a chunk even while their text is empty (a model
    without a tokenizer, text a stop string may still cut, an incomplete character)."""
    if sent.finished:
        return []
    chunks = []
    first_of_choice = not sent.started
    if not sent.started:
        sent.started = True
        first = _first_chunk(engine, call, out, prompt_logprobs, index)
        if first is not None:
            chunks.append(first)
    # the engine's outputs leave out what a stop string may still cut: text only grows
    text, new_ids, finished = completion.text, completion.token_ids, completion.finished()
    new_positions = (completion.logprobs or []) if call.logprobs is not None else []
    if text or new_positions or (call.return_token_ids and new_ids):
        chunks.append(_chunk(call, index, text,
                             _logprobs(engine, call, new_ids, new_positions, sent.chars),
                             token_ids=new_ids))
        sent.chars += len(text)
    sent.tokens += len(new_ids)
    if finished:
        sent.finished = True
        chunks.append(_chunk(call, index, None if call.chat else "", None,
                             completion.finish_reason, completion.stop_reason))
    if call.return_token_ids and first_of_choice and chunks:
        _add_prompt_token_ids(call, chunks[0], out.prompt_token_ids)
    return chunks


def _add_prompt_token_ids(call: _Call, chunk: dict, prompt_token_ids: list[int]) -> None:
    """vLLM's place for the prompt ids in a stream: the first chunk of each choice (chat: at
    the chunk's top level)."""
    (chunk if call.chat else chunk["choices"][0])["prompt_token_ids"] = list(prompt_token_ids)


def _first_chunk(engine: AsyncEngine, call: _Call, out: RequestOutput,
                 prompt_logprobs: list | None, index: int) -> dict | None:
    """Chat: the role; completions with echo: the prompt (and its logprobs)."""
    if call.chat:
        return _chunk(call, index, "", None, role=True)
    if not call.echo:
        return None
    logprobs = None
    if call.logprobs is not None:
        positions = prompt_logprobs or [None] * len(out.prompt_token_ids)
        logprobs = responses.completion_logprobs(out.prompt_token_ids, positions,
                                                 engine.token_text)
    return _chunk(call, index, _prompt_text(engine, out), logprobs)


def _logprobs(engine: AsyncEngine, call: _Call, token_ids: list[int], positions: list,
              text_offset: int) -> dict | None:
    if call.logprobs is None or not positions:
        return None
    if call.chat:
        return responses.chat_logprobs(token_ids, positions, engine.token_text, call.logprobs)
    return responses.completion_logprobs(token_ids, positions, engine.token_text, text_offset)


def _chunk(call: _Call, index: int, text: str | None, logprobs: dict | None,
           finish_reason: str | None = None, stop_reason: int | str | None = None,
           role: bool = False, token_ids: Sequence[int] = ()) -> dict:
    """One choice's chunk; ``token_ids``: the ids it brings (sent, as a list, in every chunk
    when the request asked for them)."""
    ids = _if_asked(call, token_ids)
    if call.chat:
        choice = responses.chat_choice(index, text, logprobs, finish_reason, stop_reason,
                                       delta=True, role=role, token_ids=ids)
    else:
        choice = responses.completion_choice(index, text or "", logprobs, finish_reason,
                                             stop_reason, token_ids=ids)
    payload = _envelope(call, [choice], chunk=True)
    if call.include_usage:
        payload["usage"] = None
    return payload
