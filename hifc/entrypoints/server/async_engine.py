"""The engine in a thread of its own; each request gets an asyncio stream of its outputs.

``LLMEngine`` is single-threaded. One thread owns it: it takes commands (add, abort, stop) from
a thread-safe queue, steps the engine while requests are unfinished, and hands each output to
its request's ``asyncio.Queue`` through ``loop.call_soon_threadsafe``. When nothing is
unfinished it sleeps on the command queue. Everything that touches the engine or its tokenizer
(prompt validation, chat prompts aside) runs in that thread. A ``DataParallelEngine`` takes an
``LLMEngine``'s place unchanged: its ``step`` returns what its replica processes produced.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from hifc.engine.llm_engine import LLMEngine
from hifc.parallel.data_parallel import DataParallelEngine
from hifc.engine.outputs import RequestOutput
from hifc.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread stopped (shut down or failed); no request can be served."""


class RequestObserver(Protocol):
    """Told about request timings by the engine thread (the server's metrics)."""

    def on_first_token(self, ttft_s: float) -> None: ...

    def on_finished(self, finish_reason: str | None, e2e_s: float,
                    time_per_output_token_s: float | None) -> None: ...


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    fill_context: bool = False  # max_tokens = what max_model_len leaves after the prompt


@dataclass
class _Stream:
    request_id: str
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float
    first_token_at: float | None = None


@dataclass(frozen=True)
class _Add:
    request: GenerateRequest
    stream: _Stream


@dataclass(frozen=True)
class _Abort:
    request_id: str


_STOP = object()
_ACCEPTED = object()


class RequestStream:
    """Async iterator over one request's outputs (cumulative; stale ones are skipped)."""

    def __init__(self, engine: "AsyncEngine", request_id: str, outputs: asyncio.Queue):
        self.request_id = request_id
        self._engine = engine
        self._outputs = outputs
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._outputs.get()
        while not isinstance(item, BaseException) and not item.finished \
                and not self._outputs.empty():
            item = self._outputs.get_nowait()  # outputs are cumulative: keep the newest
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
        """Abort what is running, close the engine and join its thread."""
        if self._thread.is_alive():
            self._commands.put(_STOP)
            self._thread.join(timeout)

    @property
    def is_healthy(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def stats(self) -> dict:
        """The engine's stats as of its last step (or last idle moment)."""
        return self._stats

    async def submit(self, request: GenerateRequest) -> RequestStream:
        """Queue a request; ValueError (bad prompt or parameters) before any output."""
        if not self.is_healthy:
            raise EngineDeadError("the engine is not running")
        loop = asyncio.get_running_loop()
        stream = _Stream(request.request_id, asyncio.Queue(), loop, time.monotonic())
        self._commands.put(_Add(request, stream))
        try:
            first = await self._accepted(stream)
        except asyncio.CancelledError:  # the caller went away while the request was queued
            self.abort(request.request_id)
            raise
        if isinstance(first, BaseException):
            raise first
        assert first is _ACCEPTED
        return RequestStream(self, request.request_id, stream.queue)

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
                    self._step()
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
            else:
                self.engine.abort_request(command.request_id)
                self._streams.pop(command.request_id, None)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, command: _Add) -> None:
        request, stream = command.request, command.stream
        try:
            prompt_ids = self.engine.tokenize_prompt(request.prompt)
            params = request.params
            if request.fill_context:
                params = dataclasses.replace(params,
                                             max_tokens=self.max_model_len - len(prompt_ids))
            elif len(prompt_ids) + params.max_tokens > self.max_model_len:
                raise ValueError(
                    f"this model's maximum context length is {self.max_model_len} tokens, but "
                    f"{len(prompt_ids) + params.max_tokens} were requested "
                    f"({len(prompt_ids)} in the prompt, {params.max_tokens} to generate); "
                    "reduce the prompt or max_tokens")
            self.engine.add_request(request.request_id, request.prompt, params,
                                    prompt_ids=prompt_ids)
        except Exception as exc:  # ValueError: bad input (400); anything else: 500
            self._deliver([(stream, exc)])
            return
        self._streams[request.request_id] = stream
        self._deliver([(stream, _ACCEPTED)])

    def _step(self) -> None:
        outputs = self.engine.step()
        now = time.monotonic()
        deliveries = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            self._observe(stream, out, now)
            if out.finished:
                del self._streams[out.request_id]
            deliveries.append((stream, out))
        self._deliver(deliveries)

    def _observe(self, stream: _Stream, out: RequestOutput, now: float) -> None:
        if self._observer is None:
            return
        if stream.first_token_at is None and out.token_ids:
            stream.first_token_at = now
            self._observer.on_first_token(now - stream.arrival)
        if out.finished:
            n = len(out.token_ids)
            tpot = ((now - stream.first_token_at) / (n - 1)
                    if n > 1 and stream.first_token_at is not None else None)
            self._observer.on_finished(out.finish_reason, now - stream.arrival, tpot)

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
            if isinstance(command, _Add):
                self._deliver([(command.stream, EngineDeadError("the engine is not running"))])


def _put_all(batch: list[tuple[asyncio.Queue, object]]) -> None:
    for outputs, item in batch:
        outputs.put_nowait(item)
