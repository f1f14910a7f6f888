"""Data parallelism: N engine replicas in processes of their own behind one ``LLMEngine``-like
front end, which ``LLM`` and ``hifc serve`` drive as they drive one engine.

One replica is the engine in a process of its own: ``hifc serve`` runs its engine so by default
(``build_engine(..., engine_process=True)``), so that the server's HTTP work (a chunk per
streamed token) and the engine's host work (scheduling, input packing, outputs) do not take
turns on one interpreter lock.

Each replica (:mod:`hifc.parallel.replica`) is a whole ``LLMEngine`` on its own device (replica
i on ``cuda:i``; all on the CPU in tests) with its own flash cache file (``flash_path`` names
one per replica, see :mod:`hifc.parallel.config`). The front end validates and tokenizes each
request, sends it to the replica with the fewest outstanding tokens
(:mod:`hifc.parallel.balance`), and assembles the replicas' output deltas into the same
``RequestOutput`` objects an ``LLMEngine`` returns. Replicas run and step on their own; the
front end's ``step()`` returns whatever they produced since the last call, waiting for
something when nothing has arrived yet. A request's output does not depend on its replica
(greedy, or seeded sampling): every replica loads the same weights with the same seed.

Replicas whose flash files lie on one device share it through one
:class:`~hifc.tiers.flash.arbiter.DeviceArbiter` (unless ``flash_arbiter`` is off), created
here and handed to them at spawn. Processes are started with ``torch.multiprocessing``'s spawn
method: a script that builds a data-parallel engine needs the usual
``if __name__ == "__main__":`` guard.
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass
from logging.handlers import QueueListener

import torch
import torch.multiprocessing as torch_mp

from hifc.config import EngineConfig
from hifc.engine.llm_engine import LLMEngine
from hifc.engine.logprobs import LogprobsBuilder
from hifc.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from hifc.engine.prompts import check_sampling_params, resolve_max_tokens, tokenize_prompt
from hifc.parallel.balance import LeastOutstandingTokens
from hifc.parallel.config import replica_config
from hifc.parallel.devices import replica_devices, shared_flash_devices
from hifc.parallel.messages import (LOGS_FLUSHED, AbortRequests, AddRequest, Closed,
                                    CompletionDelta, Failed, OutputDelta, Outputs, Ready,
                                    ReplicaInfo, Stop)
from hifc.parallel.replica import run_replica
from hifc.sampling_params import RequestOutputKind, SamplingParams
from hifc.structured.grammar import check_grammar
from hifc.tiers.flash.arbiter import DeviceArbiter, DeviceShare

logger = logging.getLogger(__name__)

POLL_S = 1.0  # how often a waiting front end checks that its replicas are alive
# how long step() waits for a replica that is only finishing work the front end no longer
# tracks (aborted requests' swaps, prefix writes) before it returns, so that new requests are
# not held up behind that I/O
SETTLE_WAIT_S = 0.01
STOP_TIMEOUT_S = 60.0  # for a replica to finish its I/O and exit after Stop
DEFAULT_WINDOW_CHUNKS = 4  # the arbiter's default budget, in flash chunks


def build_engine(config: EngineConfig, engine_process: bool = False
                 ) -> "LLMEngine | DataParallelEngine":
    """The engine ``config`` asks for: replicas behind a front end, one ``LLMEngine`` in this
    process, or with ``engine_process`` one in a process of its own (as one replica; a
    tensor-parallel engine stays here: it starts its ranks' processes itself)."""
    parallel = config.parallel
    if parallel.data_parallel_size > 1 or (engine_process
                                           and parallel.tensor_parallel_size == 1):
        return DataParallelEngine(config)
    return LLMEngine(config)


@dataclass
class _Tracked:
    """A request the front end has sent and not yet seen end, and what its outputs are to be
    (its ``output_kind``; replicas send what is new each step, or the final output alone).
    ``completions`` by index: for ``DELTA`` what came since its last output (the replica's
    deltas joined), otherwise its whole completions (the deltas folded in)."""

    prompt: str | None
    prompt_ids: list[int]
    output_kind: RequestOutputKind
    completions: dict[int, CompletionOutput]
    prompt_logprobs: list | None = None  # a DELTA output gives them once

    def apply(self, delta: CompletionDelta) -> int:
        """Take in one completion's delta; returns the number of new tokens."""
        index, new_ids, new_logprobs, new_text, cumulative, finish, stop = delta
        new = CompletionOutput(index, new_text, new_ids, cumulative, new_logprobs, finish, stop)
        if index in self.completions:
            self.completions[index].extend(new)
        else:
            self.completions[index] = new
        return len(new_ids)

    def output(self, request_id: str, finished: bool, num_cached_tokens: int | None,
               metrics: RequestMetrics) -> RequestOutput | None:
        """What ``LLMEngine.step`` would return for it now (a snapshot: later deltas do not
        change it; None: nothing yet)."""
        if self.output_kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        prompt_logprobs = self.prompt_logprobs
        if self.output_kind is RequestOutputKind.DELTA or finished:
            # what came since, or the last output (no delta follows): handed over
            completions = [self.completions[i] for i in sorted(self.completions)]
            if self.output_kind is RequestOutputKind.DELTA:
                self.completions, self.prompt_logprobs = {}, None
        else:
            completions = [CompletionOutput(c.index, c.text, list(c.token_ids),
                                            c.cumulative_logprob,
                                            None if c.logprobs is None else list(c.logprobs),
                                            c.finish_reason, c.stop_reason)
                           for c in self.completions.values()]
        return RequestOutput(request_id, self.prompt, self.prompt_ids, completions, finished,
                             prompt_logprobs, metrics, num_cached_tokens)


class ReplicaError(RuntimeError):
    """A replica process failed or exited unexpectedly."""


class DataParallelEngine:
    """The ``LLMEngine`` interface (add_request / step / abort_request / token_text / stats /
    close) over ``data_parallel_size`` replica processes (one or more)."""

    tier = None  # each replica's tier lives in its process; stats()["replicas"] reports it

    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = torch.device("cpu")  # this process routes requests; replicas compute
        n = config.parallel.data_parallel_size
        devices = replica_devices(config)
        configs = [replica_config(config, i, devices[i]) for i in range(n)]
        ctx = torch_mp.get_context("spawn")
        self._arbiters = _make_arbiters(config, configs, ctx)
        shares = _device_shares(self._arbiters, n)
        threads = max(1, torch.get_num_threads() // n) if devices[0] == "cpu" else None
        self._events = ctx.Queue()
        # the replicas' log records, handled by this process's loggers
        self._logs = ctx.Queue()
        self._local_logging = _LocalLogging(n)
        self._log_listener = QueueListener(self._logs, self._local_logging)
        self._log_listener.start()
        log_level = logging.getLogger().getEffectiveLevel()
        self._commands = [ctx.Queue() for _ in range(n)]
        self._processes = [
            ctx.Process(target=run_replica, name=f"hifc-replica-{i}", daemon=True,
                        args=(i, configs[i], shares[i], threads, self._commands[i],
                              self._events, self._logs, log_level))
            for i in range(n)]
        self._closed = False
        self._exited: set[int] = set()  # replicas known to have stopped
        self._stats: list[dict] = [{} for _ in range(n)]  # each replica's latest
        # commands sent to each replica, and what its latest message said: commands applied,
        # idle (its stats are final once it applied every command sent and is idle)
        self._sent = [0] * n
        self._applied = [0] * n
        self._idle = [True] * n
        self._requests: dict[str, _Tracked] = {}
        # requests that advanced since step() last returned: (the request, finished, cached
        # prompt tokens, metrics' fields) as of the newest delta
        self._pending: dict[str, tuple[_Tracked, bool, int | None, tuple]] = {}
        for process in self._processes:
            process.start()
        try:
            self.replicas: list[ReplicaInfo] = self._wait_ready()
        except BaseException:
            self.close()
            raise
        first = self.replicas[0]
        self.model_name, self.arch, self.tokenizer = first.model_name, first.arch, first.tokenizer
        self._token_texts = LogprobsBuilder(self.tokenizer)
        # every replica must take every request: the shortest context of them all
        self.limits = dataclasses.replace(
            first.limits, max_model_len=min(r.limits.max_model_len for r in self.replicas))
        self._balancer = LeastOutstandingTokens(n)

    # ---- requests -------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        """Validate a prompt and return its token ids (clear ValueErrors for bad input)."""
        return tokenize_prompt(prompt, self.tokenizer, self.arch.vocab_size,
                               self.limits.max_model_len, self.model_name)

    def check_sampling_params(self, params: SamplingParams) -> SamplingParams:
        """See ``LLMEngine.check_sampling_params`` (a grammar is parsed here, so that a bad one
        fails as the request is added; the replica compiles it)."""
        check_sampling_params(params, self.arch.vocab_size, self.config.max_logprobs,
                              self.tokenizer, self.model_name)
        if params.structured_outputs is not None:
            check_grammar(params.structured_outputs)
        return params

    def add_request(self, request_id: str, prompt: str | list[int],
                    sampling_params: SamplingParams | None = None, *,
                    prompt_ids: list[int] | None = None,
                    arrival_time: float | None = None) -> None:
        """Queue a request on the least loaded replica (see ``LLMEngine.add_request``; the
        replica takes its arrival time when the request reaches it)."""
        self._check_open()
        if request_id in self._requests or request_id in self._pending:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = self.check_sampling_params(sampling_params or SamplingParams())
        ids = self.tokenize_prompt(prompt) if prompt_ids is None else list(prompt_ids)
        # checked here as a replica would (None: what the context leaves after the prompt)
        max_new = resolve_max_tokens(params, len(ids), self.limits.max_model_len)
        text = prompt if isinstance(prompt, str) else None
        replica = self._balancer.place(request_id, len(ids), params.n * max_new,
                                       self.limits.max_model_len * params.n)
        # the replica sends what is new each step (its engine's DELTA outputs), or the final
        # output alone if that is all this request asks for
        replica_params = (dataclasses.replace(params, output_kind=RequestOutputKind.DELTA)
                          if params.output_kind is RequestOutputKind.CUMULATIVE else params)
        self._send(replica, AddRequest(request_id, text, ids, replica_params))
        whole = params.output_kind is not RequestOutputKind.DELTA
        self._requests[request_id] = _Tracked(
            text, ids, params.output_kind,
            {i: CompletionOutput(i, "", []) for i in range(params.n)} if whole else {})

    def token_text(self, token_id: int) -> str | None:
        """A token's text, decoded alone (None without a tokenizer), as ``LLMEngine``'s."""
        return self._token_texts.token_text(token_id)

    def abort_request(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        by_replica: dict[int, list[str]] = {}
        for rid in ids:
            self._pending.pop(rid, None)
            if self._requests.pop(rid, None) is None:
                continue
            by_replica.setdefault(self._balancer.replica_of(rid), []).append(rid)
            self._balancer.finished(rid)
        for replica, rids in by_replica.items():
            self._send(replica, AbortRequests(rids))

    def _send(self, replica: int, command: AddRequest | AbortRequests) -> None:
        self._commands[replica].put(command)
        self._sent[replica] += 1

    def has_unfinished_requests(self) -> bool:
        """True while a request is unfinished, has outputs ``step()`` has not returned, or a
        replica has not yet reported the state its last commands left it in (aborted requests'
        I/O, say): ``step()`` then waits for that report, and ``stats()`` is final after."""
        return bool(self._requests) or bool(self._pending) or self._unsettled()

    def _unsettled(self) -> bool:
        """A running replica has commands to apply or work left."""
        return any(i not in self._exited and (self._applied[i] < self._sent[i] or not idle)
                   for i, idle in enumerate(self._idle))

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # ---- stepping -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """The outputs of every request that advanced or finished since the last call (as
        ``LLMEngine.step`` gives them, by each request's ``output_kind``); waits for a message
        if none has arrived yet (at most ``SETTLE_WAIT_S`` when no request is unfinished)."""
        self._check_open()
        if not self._pending:
            if self._requests:
                self._handle(self._receive(block=True))
            elif self._unsettled():
                messages = self._receive_until(time.monotonic() + SETTLE_WAIT_S)
                if not messages:
                    self._check_alive()
                self._handle(messages)
        outputs = [tracked.output(request_id, finished, cached, RequestMetrics(*metrics))
                   for request_id, (tracked, finished, cached, metrics) in self._pending.items()]
        self._pending.clear()
        return [out for out in outputs if out is not None]

    def _receive(self, block: bool) -> list:
        """The replicas' messages that have arrived; with ``block``, at least one."""
        messages = []
        while True:
            try:
                if block and not messages:
                    messages.append(self._events.get(timeout=POLL_S))
                else:
                    messages.append(self._events.get_nowait())
            except queue.Empty:
                if messages or not block:
                    return messages
                self._check_alive()

    def _handle(self, messages: list) -> None:
        for message in messages:
            if isinstance(message, Outputs):
                replica = message.replica
                self._stats[replica] = message.stats
                self._applied[replica], self._idle[replica] = message.commands_applied, \
                    message.idle
                for delta in message.deltas:
                    self._apply(delta)
            elif isinstance(message, Failed):
                raise self._error(message)
            elif isinstance(message, Closed):
                self._stats[message.replica] = message.stats
                self._exited.add(message.replica)

    def _apply(self, delta: OutputDelta) -> None:
        request_id, completions, finished, num_cached_tokens, prompt_logprobs, metrics = delta
        tracked = self._requests.get(request_id)
        if tracked is None:  # aborted since
            return
        if prompt_logprobs is not None:
            tracked.prompt_logprobs = prompt_logprobs
        new_tokens = sum(tracked.apply(c) for c in completions)
        self._balancer.generated(request_id, new_tokens)
        if finished:
            del self._requests[request_id]
            self._balancer.finished(request_id)
        self._pending[request_id] = (tracked, finished, num_cached_tokens, metrics)

    # ---- replicas -------------------------------------------------------------------------
    def _wait_ready(self) -> list[ReplicaInfo]:
        """Each replica's ``Ready``, once this process's loggers have handled the records it
        logged while it started (they travel on their own queue)."""
        ready: dict[int, ReplicaInfo] = {}
        while len(ready) < len(self._processes):
            for message in self._receive(block=True):
                if isinstance(message, Failed):
                    raise self._error(message)
                if isinstance(message, Ready):
                    ready[message.replica] = message.info
                    self._stats[message.replica] = message.stats
        while not self._local_logging.wait_flushed(POLL_S):
            self._check_alive()
        return [ready[i] for i in range(len(self._processes))]

    def _check_alive(self) -> None:
        for index, process in enumerate(self._processes):
            if process.is_alive() or index in self._exited:
                continue
            self._exited.add(index)
            self._forget(index)
            late = [m for m in self._receive(block=False) if isinstance(m, Failed)]
            if late:
                raise self._error(late[0])
            raise ReplicaError(f"{self._name(index)} exited unexpectedly (exit code "
                               f"{process.exitcode})")

    def _forget(self, index: int) -> None:
        """A replica is gone: release its place in its flash device's arbiter."""
        for arbiter, replicas in self._arbiters:
            if index in replicas:
                arbiter.forget(replicas.index(index))

    def _name(self, index: int) -> str:
        return f"replica {index}" if len(self._processes) > 1 else "the engine process"

    def _error(self, failed: Failed) -> Exception:
        where = self._name(failed.replica)
        if failed.kind == "ValueError":  # bad options or input: the same error as one engine
            return ValueError(f"{failed.message} ({where})")
        return ReplicaError(f"{where} failed: {failed.kind}: {failed.message}\n"
                            f"{failed.traceback}")

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this engine is closed")

    # ---- statistics and shutdown -------------------------------------------------------------
    def stats(self) -> dict:
        """The replicas' stats summed (the keys of ``LLMEngine.stats``), plus ``replicas`` (each
        replica's own, with its device, flash file and arbiter waits) and ``flash_devices``
        (each shared device's arbiter: window, measured rate, bytes and waits by priority)."""
        if not self._closed:
            self._handle(self._receive(block=False))
        per_replica = [s for s in self._stats if s]
        totals = {key: _sum_known(s.get(key) for s in per_replica)
                  for key in (per_replica[0] if per_replica else {})}
        replicas = [{"replica": i, "device": info.device, "flash_path": info.flash_path,
                     **self._stats[i]} for i, info in enumerate(self.replicas)]
        devices = [{**arbiter.stats(), "replica_ids": list(ids)}
                   for arbiter, ids in self._arbiters]
        return {**totals, "data_parallel_size": len(self._processes), "replicas": replicas,
                "flash_devices": devices}

    def close(self) -> None:
        """Stop every replica (each aborts what it runs, waits for its I/O and releases its
        tier) and wait for its process to exit."""
        if self._closed:
            return
        self._closed = True
        self._requests.clear()
        self._pending.clear()
        for index, commands in enumerate(self._commands):
            if self._processes[index].is_alive():
                commands.put(Stop())
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(p.is_alive() and i not in self._exited
                  for i, p in enumerate(self._processes)) and time.monotonic() < deadline:
            for message in self._receive_until(deadline):
                if isinstance(message, Closed):
                    self._stats[message.replica] = message.stats
                    self._exited.add(message.replica)
                elif isinstance(message, Failed):
                    logger.error("%s", self._error(message))
        for process in self._processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.warning("%s did not stop; terminating it", process.name)
                process.terminate()
                process.join()
        for commands in self._commands:  # every replica has exited: nothing left to deliver
            commands.cancel_join_thread()
            commands.close()
        self._events.close()
        self._log_listener.stop()  # handles what is queued, then returns
        self._logs.close()

    def _receive_until(self, deadline: float) -> list:
        try:
            return [self._events.get(timeout=max(0.01, min(POLL_S, deadline - time.monotonic())))]
        except queue.Empty:
            return []

    def __enter__(self) -> "DataParallelEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _LocalLogging(logging.Handler):
    """Hands a replica's log record to this process's logger of the same name, and notes which
    of the ``num_replicas`` replicas' start-up records it has handled
    (``messages.logs_flushed``)."""

    def __init__(self, num_replicas: int):
        super().__init__()
        self._num_replicas = num_replicas
        self._flushed: set[int] = set()
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        replica = getattr(record, LOGS_FLUSHED, None)
        if replica is not None:
            with self._changed:
                self._flushed.add(replica)
                self._changed.notify_all()
            return
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)

    def wait_flushed(self, timeout: float) -> bool:
        """Whether every replica's start-up records have been handled, waiting up to timeout
        seconds for them."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._flushed) == self._num_replicas,
                                          timeout)


def _sum_known(values) -> float | None:
    """The sum of the values that are known (None: a rate not measured yet), None if none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _make_arbiters(config: EngineConfig, configs: list[EngineConfig], ctx
                   ) -> list[tuple[DeviceArbiter, list[int]]]:
    """One arbiter per flash device that holds several replicas' files (and the replicas it
    serves, in its own order), unless the arbiter is off."""
    tier, parallel = config.tier, config.parallel
    if tier.kv_offload != "flash" or not parallel.flash_arbiter:
        return []
    window_mib = parallel.flash_arbiter_window_mib or DEFAULT_WINDOW_CHUNKS * tier.flash_chunk_mib
    paths = [c.tier.flash_path for c in configs]
    return [(DeviceArbiter(label, len(replicas), window_mib << 20, ctx=ctx), replicas)
            for label, replicas in shared_flash_devices(paths)]


def _device_shares(arbiters: list[tuple[DeviceArbiter, list[int]]], num_replicas: int
                   ) -> list[DeviceShare | None]:
    shares: list[DeviceShare | None] = [None] * num_replicas
    for arbiter, replicas in arbiters:
        for position, replica in enumerate(replicas):
            shares[replica] = DeviceShare(arbiter, position)
    return shares
