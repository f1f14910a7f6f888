"""The engine in a thread of its own; each request gets an asyncio stream of its outputs.

``LLMEngine`` is single-threaded. One thread owns it: it takes commands (add, abort, stop) from
a thread-safe queue, steps the engine while requests are unfinished, and hands each output to
its request's ``asyncio.Queue`` through ``loop.call_soon_threadsafe``. When nothing is
unfinished it sleeps on the command queue. Everything that touches the engine or its tokenizer
(prompt validation, chat prompts aside) runs in that thread. A ``DataParallelEngine`` takes an
``LLMEngine``'s place unchanged: its ``step`` returns what its replica processes produced.
``hifc serve`` gives it one by default (one replica: the engine in a process of its own), so
that the event loop's work per streamed chunk and the engine's host work per step do not
share an interpreter lock.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from hifc.engine.llm_engine import LLMEngine
from hifc.parallel.data_parallel import DataParallelEngine
from hifc.engine.outputs import RequestMetrics, RequestOutput
from hifc.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shut down or failed); no request can be served."""


@dataclass(frozen=True)
class FinishedRequest:
    """A request at its end, whatever its outputs gave on the way."""
    metrics: RequestMetrics
    prompt_tokens: int
    generated: list[int]  # tokens per completion
    finish_reason: str | None  # its first completion's


class RequestObserver(Protocol):
    """Told about requests by the engine thread (the server's metrics)."""

    def on_first_token(self, output: RequestOutput) -> None: ...

    def on_finished(self, request: FinishedRequest) -> None: ...


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams  # max_tokens None: what max_model_len leaves after the prompt


@dataclass
class _Stream:
    request_id: str
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival_time: float  # time.time()
    delta: bool = False  # its outputs are DELTA outputs
    first_token_seen: bool = False
    # what its outputs gave so far, for the observer: tokens per completion (DELTA outputs
    # add, others tell all) and its first completion's finish reason
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(frozen=True)
class _Add:
    """Requests submitted together: all are queued, or none (the first error answers all)."""
    requests: list[GenerateRequest]
    streams: list[_Stream]


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Call:
    """Run ``fn`` in the engine thread (tokenizer work) and answer on ``stream``."""
    fn: Callable[[], Any]
    stream: _Stream


_STOP = object()
_ACCEPTED = object()


@dataclass(frozen=True)
class _Failure:
    error: Exception


class RequestStream:
    """Async iterator over one request's outputs, of its ``output_kind``. Outputs that queued
    up while the reader was busy come as one: ``DELTA`` outputs joined, otherwise the newest
    (a snapshot makes the ones before it stale)."""

    def __init__(self, engine: "AsyncEngine", request_id: str, outputs: asyncio.Queue,
                 delta: bool):  # delta: the request's outputs are DELTA outputs
        self.request_id = request_id
        self._engine = engine
        self._outputs = outputs
        self._delta = delta
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._outputs.get()
        while not isinstance(item, BaseException) and not item.finished \
                and not self._outputs.empty():
            later = self._outputs.get_nowait()
            if self._delta and not isinstance(later, BaseException):
                item.extend(later)
            else:
                item = later
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def abort(self) -> None:
        """Stop generating and free the request's blocks (no-op once finished)."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


class AsyncEngine:
    def __init__(self, engine: LLMEngine | DataParallelEngine,
                 observer: RequestObserver | None = None):
        self.engine = engine
        self.model_name = engine.model_name
        self.max_model_len = engine.limits.max_model_len
        self.vocab_size = engine.arch.vocab_size
        # for chat templates only (pure Python rendering); encoding stays in the engine thread
        self.tokenizer = engine.tokenizer
        self._observer = observer
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # touched by the engine thread only
        self._stats: dict = engine.stats()  # replaced (never mutated) by the engine thread
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hifc-engine", daemon=True)

    # ---- called from the event loop -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort what is running, close the engine and join its thread (or close the engine
        if the thread never started)."""
        if self._thread.is_alive():
            self._commands.put(_STOP)
            self._thread.join(timeout)
        elif self._thread.ident is None:
            self.engine.close()

    @property
    def is_healthy(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def token_text(self, token_id: int) -> str:
        """A token's text for log-probabilities (``token_id:N`` for a model without a
        tokenizer); cached decodes, safe from the event loop."""
        text = self.engine.token_text(token_id)
        return f"token_id:{token_id}" if text is None else text

    def stats(self) -> dict:
        """The engine's stats as of its last step (or last idle moment)."""
        return self._stats

    async def submit(self, requests: list[GenerateRequest]) -> list[RequestStream]:
        """Queue requests, all or none; ValueError (bad prompt or parameters) before any
        output."""
        if not self.is_healthy:
            raise EngineDeadError("the engine is not running")
        loop = asyncio.get_running_loop()
        now = time.time()
        streams = [_Stream(r.request_id, asyncio.Queue(), loop, now,
                           delta=r.params.output_kind is RequestOutputKind.DELTA,
                           generated=[0] * r.params.n)
                   for r in requests]
        self._commands.put(_Add(list(requests), streams))
        try:
            first = await self._accepted(streams[0])
        except asyncio.CancelledError:  # the caller went away while the requests were queued
            for r in requests:
                self.abort(r.request_id)
            raise
        if isinstance(first, BaseException):
            raise first
        assert first is _ACCEPTED
        return [RequestStream(self, r.request_id, s.queue, s.delta)
                for r, s in zip(requests, streams)]

    async def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run in the engine thread (which owns the tokenizer's encoder); its
        exception is raised here."""
        if not self.is_healthy:
            raise EngineDeadError("the engine is not running")
        stream = _Stream("", asyncio.Queue(), asyncio.get_running_loop(), time.time())
        self._commands.put(_Call(fn, stream))
        result = await self._accepted(stream)
        if isinstance(result, _Failure):
            raise result.error
        return result

    async def _accepted(self, stream: _Stream) -> object:
        while True:  # the engine answers within a step; poll in case its thread just stopped
            try:
                return await asyncio.wait_for(stream.queue.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if not self._thread.is_alive():
                    raise EngineDeadError("the engine is not running") from None

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    # ---- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            device = self.engine.device
            if device.type == "cuda" and device.index is not None:
                import torch
                torch.cuda.set_device(device)  # Triton launches on the thread's current device
            while self._take_commands(block=not self.engine.has_unfinished_requests()):
                if self.engine.has_unfinished_requests():
                    self._step()  # takes the stats itself
                else:
                    self._stats = self.engine.stats()
        except Exception as exc:  # an engine bug: fail every request, report unhealthy
            logger.exception("engine thread failed")
            self._error = exc
            self._fail_all(EngineDeadError(f"engine failed: {type(exc).__name__}: {exc}"))
        finally:
            self._fail_all(EngineDeadError("the server is shutting down"))
            self._drain_commands()
            try:
                self.engine.close()
            except Exception:
                logger.exception("closing the engine failed")
            self._stats = self.engine.stats()

    def _take_commands(self, block: bool) -> bool:
        """Apply queued commands (waiting for one if ``block``); False on stop."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if command is _STOP:
                return False
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Call):
                self._call(command)
            else:
                self.engine.abort_request(command.request_id)
                self._streams.pop(command.request_id, None)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, command: _Add) -> None:
        engine = self.engine
        try:
            checked = []
            for request in command.requests:  # validate all before queueing any
                engine.check_sampling_params(request.params)
                prompt_ids = engine.tokenize_prompt(request.prompt)
                self._check_context(prompt_ids, request.params)
                checked.append(prompt_ids)
            for request, stream, prompt_ids in zip(command.requests, command.streams, checked):
                engine.add_request(request.request_id, request.prompt, request.params,
                                   prompt_ids=prompt_ids, arrival_time=stream.arrival_time)
                self._streams[request.request_id] = stream
        except Exception as exc:  # ValueError: bad input (400); anything else: 500
            for request in command.requests:
                self._streams.pop(request.request_id, None)
            engine.abort_request([r.request_id for r in command.requests])
            self._deliver([(command.streams[0], exc)])
            return
        self._deliver([(command.streams[0], _ACCEPTED)])

    def _call(self, command: _Call) -> None:
        try:
            result = command.fn()
        except Exception as exc:
            result = _Failure(exc)
        self._deliver([(command.stream, result)])

    def _check_context(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if params.max_tokens is not None and \
                len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens, but "
                f"{len(prompt_ids) + params.max_tokens} were requested "
                f"({len(prompt_ids)} in the prompt, {params.max_tokens} to generate); "
                "reduce the prompt or max_tokens")

    def _step(self) -> None:
        outputs = self.engine.step()
        # the stats before the outputs: a client that reads /metrics after its response finds
        # the response's tokens counted
        self._stats = self.engine.stats()
        deliveries = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            self._observe(stream, out)
            if out.finished:
                del self._streams[out.request_id]
            deliveries.append((stream, out))
        self._deliver(deliveries)

    def _observe(self, stream: _Stream, out: RequestOutput) -> None:
        if self._observer is None:
            return
        if not stream.first_token_seen and out.metrics.first_token_time is not None:
            stream.first_token_seen = True
            self._observer.on_first_token(out)
        generated = stream.generated
        for c in out.outputs:
            generated[c.index] = len(c.token_ids) + (generated[c.index] if stream.delta else 0)
            if c.index == 0 and c.finish_reason is not None:
                stream.finish_reason = c.finish_reason
        if out.finished:
            self._observer.on_finished(FinishedRequest(
                out.metrics, len(out.prompt_token_ids), generated, stream.finish_reason))

    @staticmethod
    def _deliver(items: list[tuple[_Stream, object]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for stream, item in items:
            by_loop.setdefault(stream.loop, []).append((stream.queue, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    def _fail_all(self, exc: BaseException) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        if streams:
            try:
                self.engine.abort_request([s.request_id for s in streams])
            except Exception:
                logger.exception("aborting the remaining requests failed")
        self._deliver([(s, exc) for s in streams])

    def _drain_commands(self) -> None:
        """Answer requests that were queued after the engine stopped."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            dead = EngineDeadError("the engine is not running")
            if isinstance(command, _Add):
                self._deliver([(command.streams[0], dead)])
            elif isinstance(command, _Call):
                self._deliver([(command.stream, _Failure(dead))])


def _put_all(batch: list[tuple[asyncio.Queue, object]]) -> None:
    for outputs, item in batch:
        outputs.put_nowait(item)
