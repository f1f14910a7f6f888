"""One data-parallel replica: an ``LLMEngine`` in a process of its own, driven through queues.

The front end spawns :func:`run_replica`. It builds the engine (on its own device, with its own
flash file and, where the device is shared, the device's arbiter), says ``Ready``, then loops:
apply the commands that arrived (waiting for one while it has nothing to do), step the engine
while it has work, and send the step's outputs as deltas with its stats. When the front end's
process is gone it stops by itself.
"""
from __future__ import annotations

import logging
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
from hifc.parallel.messages import (AbortRequests, AddRequest, Closed, Failed, OutputDelta,
                                    Outputs, Ready, ReplicaInfo, Stop, logs_flushed,
                                    metrics_fields)
from hifc.tiers.flash.arbiter import DeviceShare

logger = logging.getLogger(__name__)

IDLE_POLL_S = 1.0  # an idle replica checks this often that the front end is still there


def _delta(out: RequestOutput) -> OutputDelta:
    """A step's output as the message carries it: a ``DELTA`` output, or the final output of
    a ``FINAL_ONLY`` request (the front end passes no other kind; both add to nothing sent
    before)."""
    completions = [(c.index, c.token_ids, None if c.logprobs is None else list(c.logprobs),
                    c.text, c.cumulative_logprob, c.finish_reason, c.stop_reason)
                   for c in out.outputs]
    return (out.request_id, completions, out.finished, out.num_cached_tokens,
            out.prompt_logprobs, metrics_fields(out.metrics))


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
    logs.put(logs_flushed(index))  # after its start-up records on the same queue, in order
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
    applied = 0  # commands applied: every Outputs tells the front end how many

    def send(deltas: list[OutputDelta]) -> None:
        events.put(Outputs(index, deltas, _stats(engine, device_share), applied,
                           not engine.has_unfinished_requests()))

    while True:
        received = _next_commands(commands, block=not engine.has_unfinished_requests())
        if received is None:
            return
        for command in received:
            refusal = _apply(command, engine, index)
            applied += 1
            if refusal is not None:
                send([refusal])
        if engine.has_unfinished_requests():
            deltas = [_delta(out) for out in engine.step()]
            if deltas or not engine.has_unfinished_requests():
                send(deltas)
        elif received:  # commands (aborts, say) left it idle: say so
            send([])


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


def _apply(command, engine: LLMEngine, index: int) -> OutputDelta | None:
    """Apply a command; the output that refuses its request, if the engine refused it."""
    if isinstance(command, AbortRequests):
        engine.abort_request(command.request_ids)
        return None
    assert isinstance(command, AddRequest)
    try:
        engine.add_request(command.request_id, command.prompt or command.prompt_ids,
                           command.params, prompt_ids=command.prompt_ids)
    except ValueError as exc:  # the front end checked the prompt; this should not happen
        logger.warning("replica %d refused request %s: %s", index, command.request_id, exc)
        aborted = [(i, [], None, "", None, "abort", None) for i in range(command.params.n)]
        return (command.request_id, aborted, True, None, None,
                metrics_fields(RequestMetrics(time.time())))
    return None


def _stats(engine: LLMEngine, device_share: DeviceShare | None) -> dict:
    stats = engine.stats()
    if device_share is not None:
        stats.update({f"arbiter_{k}": v for k, v in device_share.stats().items()})
    return stats


def _failed(index: int, exc: BaseException) -> Failed:
    return Failed(index, type(exc).__name__, str(exc), traceback.format_exc())
