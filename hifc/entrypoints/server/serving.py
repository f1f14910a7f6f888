"""Completions and chat completions: request -> engine stream -> OpenAI response or SSE."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from hifc.engine.outputs import RequestOutput
from hifc.entrypoints.server.async_engine import (AsyncEngine, EngineDeadError, GenerateRequest,
                                                  RequestStream)
from hifc.entrypoints.server.errors import APIError, error_body
from hifc.entrypoints.server.protocol import (ChatCompletionRequest, CompletionRequest,
                                              DEFAULT_COMPLETION_MAX_TOKENS)
from hifc.sampling_params import SamplingParams


@dataclass(frozen=True)
class _Call:
    """What shapes one response: the endpoint's object names and ids."""
    chat: bool
    response_id: str
    model: str
    created: int
    include_usage: bool
    holdback: int  # characters kept back while streaming: a stop string may still cut them


def _usage(out: RequestOutput) -> dict:
    prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens or 0}}


def _choice(call: _Call, text: str | None, finish_reason: str | None, delta: bool) -> dict:
    if not call.chat:
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    key = "delta" if delta else "message"
    message = {} if text is None else {"content": text}
    if not delta:
        message["role"] = "assistant"
    return {"index": 0, key: message, "logprobs": None, "finish_reason": finish_reason}


def _envelope(call: _Call, choices: list[dict], chunk: bool) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if call.chat \
        else "text_completion"
    return {"id": call.response_id, "object": obj, "created": call.created, "model": call.model,
            "choices": choices}


async def create_completion(engine: AsyncEngine, body: CompletionRequest, request: Request):
    body.check_supported()
    max_tokens = (DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens)
    params = _sampling_params(body, max_tokens)
    call = _new_call(body, params, chat=False)
    stream = await _submit(engine, GenerateRequest(call.response_id, body.prompt, params))
    return await _respond(stream, call, bool(body.stream), request)


async def create_chat_completion(engine: AsyncEngine, body: ChatCompletionRequest,
                                 request: Request):
    body.check_supported()
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise APIError(400, f"model {body.model!r} has no tokenizer or chat template: use "
                            "/v1/completions with token ids", param="messages")
    try:
        prompt = tokenizer.apply_chat_template(body.conversation(),
                                               add_generation_prompt=body.add_generation_prompt)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None
    max_tokens = body.requested_max_tokens
    params = _sampling_params(body, 1 if max_tokens is None else max_tokens)
    call = _new_call(body, params, chat=True)
    stream = await _submit(engine, GenerateRequest(call.response_id, prompt, params,
                                                   fill_context=max_tokens is None))
    return await _respond(stream, call, bool(body.stream), request)


def _sampling_params(body, max_tokens: int):
    try:
        return body.sampling_params(max_tokens)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def _new_call(body, params: SamplingParams, chat: bool) -> _Call:
    prefix = "chatcmpl" if chat else "cmpl"
    return _Call(chat, f"{prefix}-{uuid.uuid4().hex}", body.model, int(time.time()),
                 body.include_usage, max(map(len, params.stop), default=1) - 1)


async def _submit(engine: AsyncEngine, request: GenerateRequest) -> RequestStream:
    try:
        return await engine.submit(request)
    except ValueError as exc:  # bad prompt: empty, too long, token ids out of vocab, ...
        raise APIError(400, str(exc), param="prompt" if "prompt" in str(exc) else None) from None
    except EngineDeadError as exc:
        raise APIError(503, str(exc)) from None


async def _respond(stream: RequestStream, call: _Call, streaming: bool, request: Request):
    if streaming:
        return _AbortingStreamingResponse(stream, _sse(stream, call))
    final = await _collect_unless_disconnected(stream, request)
    if final is None:  # the client left; its request was aborted
        return JSONResponse(error_body(499, "client disconnected"), status_code=499)
    choice = _choice(call, final.text, final.finish_reason, delta=False)
    return JSONResponse({**_envelope(call, [choice], chunk=False), "usage": _usage(final)})


class _AbortingStreamingResponse(StreamingResponse):
    """Server-sent events that abort the request however the response ends (finished, client
    gone before or during the stream, server shutting down)."""

    def __init__(self, stream: RequestStream, events: AsyncIterator[str]):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._stream = stream

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stream.abort()


async def _collect_unless_disconnected(stream: RequestStream,
                                       request: Request) -> RequestOutput | None:
    """The final output, or None (request aborted) if the client disconnects first."""
    async def last_output() -> RequestOutput:
        final = None
        async for out in stream:
            final = out
        return final

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    consume = asyncio.ensure_future(last_output())
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
        stream.abort()


async def _sse(stream: RequestStream, call: _Call) -> AsyncIterator[str]:
    """Server-sent events (wrapped in :class:`_AbortingStreamingResponse`, which aborts the
    request however the stream ends)."""
    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def chunk(text: str | None, finish_reason: str | None) -> dict:
        payload = _envelope(call, [_choice(call, text, finish_reason, delta=True)], chunk=True)
        if call.include_usage:
            payload["usage"] = None
        return payload

    if call.chat:
        first = chunk("", None)
        first["choices"][0]["delta"]["role"] = "assistant"
        yield event(first)
    sent, final = 0, None
    try:
        async for out in stream:
            final = out
            text = out.text
            upto = len(text) if out.finished else max(sent, len(text) - call.holdback)
            if upto > sent:
                yield event(chunk(text[sent:upto], None))
                sent = upto
    except EngineDeadError as exc:
        yield event(error_body(503, str(exc)))
        yield "data: [DONE]\n\n"
        return
    yield event(chunk(None if call.chat else "", final.finish_reason))
    if call.include_usage:
        yield event({**_envelope(call, [], chunk=True), "usage": _usage(final)})
    yield "data: [DONE]\n\n"
