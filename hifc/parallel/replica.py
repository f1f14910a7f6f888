"""One data-parallel replica: an ``LLMEngine`` in a process of its own, driven through queues.

The front end spawns :func:`run_replica`. It builds the engine (on its own device, with its own
flash file and, where the device is shared, the device's arbiter), says ``Ready``, then loops:
apply the commands that arrived (waiting for one while it has nothing to do), step the engine
while it has work, and send the step's outputs as deltas with its stats. When the front end's
process is gone it stops by itself.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import time
import traceback
from logging.handlers import QueueHandler
from multiprocessing import parent_process

import torch

from hifc.config import EngineConfig
from hifc.engine.gc_heap import frozen_heap
from hifc.engine.llm_engine import LLMEngine
from hifc.engine.outputs import RequestMetrics, RequestOutput
from hifc.parallel.messages import (AbortRequests, AddRequest, Closed, CompletionDelta, Failed,
                                    OutputDelta, Outputs, Ready, ReplicaInfo, Stop,
                                    metrics_fields)
from hifc.tiers.flash.arbiter import DeviceShare

logger = logging.getLogger(__name__)

IDLE_POLL_S = 1.0  # an idle replica checks this often that the front end is still there


class DeltaWriter:
    """What each request's last message said, to send only what changed since."""

    def __init__(self) -> None:
        # request id -> completion index -> (tokens sent, text sent); absent: nothing sent yet
        self._sent: dict[str, dict[int, tuple[int, str]]] = {}

    def add(self, request_id: str) -> None:
        self._sent[request_id] = {}

    def forget(self, request_id: str) -> None:
        self._sent.pop(request_id, None)

    def delta(self, out: RequestOutput) -> OutputDelta | None:
        sent = self._sent.get(out.request_id)
        if sent is None:  # aborted meanwhile
            return None
        first = not sent
        completions = [d for d in (_completion_delta(c, sent) for c in out.outputs)
                       if d is not None]
        if out.finished:
            del self._sent[out.request_id]
        return (out.request_id, completions, out.finished, out.num_cached_tokens,
                out.prompt_logprobs if first else None, metrics_fields(out.metrics))


def _completion_delta(c, sent: dict[int, tuple[int, str]]) -> CompletionDelta | None:
    num_sent, text_sent = sent.get(c.index, (0, ""))
    if (c.index in sent and len(c.token_ids) == num_sent and c.text == text_sent
            and c.finish_reason is None):
        return None
    keep = (len(text_sent) if c.text.startswith(text_sent)
            else len(os.path.commonprefix((text_sent, c.text))))
    sent[c.index] = (len(c.token_ids), c.text)
    return (c.index, c.token_ids[num_sent:],
            None if c.logprobs is None else list(c.logprobs[num_sent:]),
            keep, c.text[keep:], c.cumulative_logprob, c.finish_reason, c.stop_reason)


def run_replica(index: int, config: EngineConfig, device_share: DeviceShare | None,
                torch_threads: int | None, commands, events, logs, log_level: int) -> None:
    """The replica process's main function (``commands``/``events``: its queue from the front
    end, and the queue of all replicas to it; ``logs``: where its log records of
    ``log_level`` and above go, for the front end's loggers to handle)."""
    # Ctrl-C reaches the whole process group: the front end stops this process (Stop), or it
    # stops by itself once the front end's process is gone
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    root = logging.getLogger()
    root.handlers[:] = [QueueHandler(logs)]
    root.setLevel(log_level)
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        if config.device.startswith("cuda:"):
            torch.cuda.set_device(torch.device(config.device))  # Triton launches on it
        engine = LLMEngine(config, device_share)
    except BaseException as exc:  # bad options, a missing model, a locked file, ...
        events.put(_failed(index, exc))
        return
    tier = config.tier
    events.put(Ready(index, ReplicaInfo(
        engine.model_name, engine.arch, engine.tokenizer, engine.limits, str(engine.device),
        tier.flash_path if tier.kv_offload == "flash" else None), _stats(engine, device_share)))
    try:
        with frozen_heap():
            _serve(index, engine, device_share, commands, events)
    except BaseException as exc:
        logger.exception("replica %d failed", index)
        events.put(_failed(index, exc))
        raise SystemExit(1) from None
    finally:
        engine.close()
    events.put(Closed(index, _stats(engine, device_share)))


def _serve(index: int, engine: LLMEngine, device_share: DeviceShare | None, commands,
           events) -> None:
    writer = DeltaWriter()
    while True:
        received = _next_commands(commands, block=not engine.has_unfinished_requests())
        if received is None:
            return
        for command in received:
            _apply(command, engine, writer, events, index, device_share)
        if engine.has_unfinished_requests():
            deltas = [d for d in map(writer.delta, engine.step()) if d is not None]
            if deltas or not engine.has_unfinished_requests():
                events.put(Outputs(index, deltas, _stats(engine, device_share)))
        elif received:  # aborts left it idle: say so
            events.put(Outputs(index, [], _stats(engine, device_share)))


def _next_commands(commands, block: bool) -> list | None:
    """The commands that arrived (with ``block``, waiting for one); None on ``Stop`` or when
    the front end's process is gone."""
    received = []
    try:
        command = commands.get(timeout=IDLE_POLL_S) if block else commands.get_nowait()
    except queue.Empty:
        return None if block and not parent_process().is_alive() else received
    while True:
        if isinstance(command, Stop):
            return None
        received.append(command)
        try:
            command = commands.get_nowait()
        except queue.Empty:
            return received


def _apply(command, engine: LLMEngine, writer: DeltaWriter, events, index: int,
           device_share: DeviceShare | None) -> None:
    if isinstance(command, AbortRequests):
        engine.abort_request(command.request_ids)
        for request_id in command.request_ids:
            writer.forget(request_id)
        return
    assert isinstance(command, AddRequest)
    try:
        engine.add_request(command.request_id, command.prompt or command.prompt_ids,
                           command.params, prompt_ids=command.prompt_ids)
    except ValueError as exc:  # the front end checked the prompt; this should not happen
        logger.warning("replica %d refused request %s: %s", index, command.request_id, exc)
        aborted = [(i, [], None, 0, "", None, "abort", None) for i in range(command.params.n)]
        refusal = (command.request_id, aborted, True, None, None,
                   metrics_fields(RequestMetrics(time.time())))
        events.put(Outputs(index, [refusal], _stats(engine, device_share)))
        return
    writer.add(command.request_id)


def _stats(engine: LLMEngine, device_share: DeviceShare | None) -> dict:
    stats = engine.stats()
    if device_share is not None:
        stats.update({f"arbiter_{k}": v for k, v in device_share.stats().items()})
    return stats


def _failed(index: int, exc: BaseException) -> Failed:
    return Failed(index, type(exc).__name__, str(exc), traceback.format_exc())
