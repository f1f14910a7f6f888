"""The engine in a process of its own (``hifc serve``'s default): the server answers as it does
with the engine in the server's process (texts, token log-probabilities with their texts,
streams, refusals), the engine's log records reach the server's loggers, /metrics reads as one
engine's (idle once the request aborted last is gone), and the process stops with the server,
quietly on Ctrl-C; a killed engine process fails requests and /health."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time

import pytest

from hifc.config import EngineConfig
from hifc.engine.llm_engine import LLMEngine
from hifc.parallel import data_parallel
from hifc.entrypoints.server.async_engine import AsyncEngine, GenerateRequest
from hifc.parallel.data_parallel import DataParallelEngine, build_engine
from hifc.sampling_params import RequestOutputKind, SamplingParams
from tests.server.helpers import app_client, metric_values, start_server, stop_server

PROMPTS = ["Flash memory keeps the key value cache", "Pages move to the drive and back"]
BODY = dict(model="m", max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)


BAD = [dict(guided_regex="("), dict(max_tokens=None, min_tokens=60),  # a bad regex, no room
       dict(prompt=list(range(5, 69)), max_tokens=None)]  # for min_tokens, a prompt too long


def _answers(engine) -> tuple[list, tuple, dict[str, float]]:
    """Each bad request's status and message, then each prompt's completion choice; one
    streamed prompt's text, tokens and finish reason; /metrics."""
    with app_client(engine) as client:
        choices = []
        for fields in BAD:  # refused as the request is added: the engine goes on serving
            resp = client.post("/v1/completions", json={**BODY, "prompt": PROMPTS[0], **fields})
            choices.append((resp.status_code, resp.json()["error"]["message"]))
        for prompt in PROMPTS:
            resp = client.post("/v1/completions", json={**BODY, "prompt": prompt})
            assert resp.status_code == 200, resp.text
            choices.append(resp.json()["choices"][0])
        with client.stream("POST", "/v1/completions",
                           json={**BODY, "prompt": PROMPTS[0], "stream": True}) as resp:
            events = [line[len("data: "):] for line in resp.iter_lines()
                      if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
        values = metric_values(client.get("/metrics").text)
    # a chunk may bring several tokens (whatever arrived since the last): compare the stream
    streamed = ("".join(c["text"] for c in chunks),
                [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]],
                [c["finish_reason"] for c in chunks][-1])
    return choices, streamed, values


class _SlowAt(logging.Handler):
    """Sleeps when it handles a record whose message starts with ``prefix``."""

    def __init__(self, prefix: str, seconds: float):
        super().__init__()
        self.prefix, self.seconds, self.held = prefix, seconds, False

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.held = True
            time.sleep(self.seconds)


def test_engine_process_serves_what_the_engine_in_the_server_gives(tiny_model_dir, caplog):
    config = EngineConfig.from_options(str(tiny_model_dir), device="cpu", block_size=16,
                                       max_model_len=64, num_gpu_blocks=32)
    expected, expected_stream, expected_values = _answers(LLMEngine(config))
    # this process handles the engine process's log records in a thread of their own: held at
    # an earlier record, it has not reached the start-up line when the engine says it is ready
    # unless start-up waits for it
    runner_log = logging.getLogger("hifc.runtime.model_runner")
    slow = _SlowAt("decode steps run unpadded", 1.0)
    runner_log.addHandler(slow)
    with caplog.at_level(logging.INFO):
        try:
            engine = build_engine(config, engine_process=True)
        finally:
            runner_log.removeHandler(slow)
        assert slow.held, "the engine process did not log the record the handler holds at"
        assert isinstance(engine, DataParallelEngine) and len(engine._processes) == 1
        started = [r for r in caplog.records if r.processName != "MainProcess"
                   and r.name == "hifc.runtime.model_runner"
                   and r.getMessage().startswith("started up in")]
        assert started, "the engine process's start-up log line did not reach this process"
        choices, stream, values = _answers(engine)
    # leaving the client shut the engine down: its process has exited cleanly
    assert not engine._processes[0].is_alive() and engine._processes[0].exitcode == 0
    assert choices == expected and stream == expected_stream
    assert [status for status, _ in choices[:len(BAD)]] == [400] * len(BAD)
    first = choices[len(BAD)]
    assert stream[0] == first["text"] and stream[2] == "length"
    tops = first["logprobs"]["top_logprobs"]
    assert tops and all(not t.startswith("token_id:") for top in tops for t in top)  # texts
    # the same series as one engine in the server's process: no per-replica labels
    assert not [k for k in values if k.startswith("hifc_replica_")]
    assert sorted(values) == sorted(expected_values)
    assert values["vllm:generation_tokens_total{model_name=m}"] == \
        expected_values["vllm:generation_tokens_total{model_name=m}"]


def test_a_bad_engine_option_fails_as_one_engine_does(tmp_path):
    config = EngineConfig.from_options(str(tmp_path / "no-such-model"), device="cpu")
    with pytest.raises(ValueError, match=r"\(the engine process\)$") as process_error:
        build_engine(config, engine_process=True)
    with pytest.raises(ValueError) as engine_error:
        LLMEngine(config)
    assert str(process_error.value) == f"{engine_error.value} (the engine process)"


def test_serve_runs_the_engine_in_a_process_unless_asked_or_tensor_parallel(monkeypatch):
    from hifc.entrypoints.cli import build_parser

    assert build_parser().parse_args(["serve", "m"]).engine_process is True
    assert build_parser().parse_args(["serve", "m", "--no-engine-process"]).engine_process \
        is False
    built = []
    monkeypatch.setattr(data_parallel, "DataParallelEngine", lambda c: built.append("process"))
    monkeypatch.setattr(data_parallel, "LLMEngine", lambda c: built.append("here"))
    for options, engine_process in ((dict(), True), (dict(), False),
                                    (dict(tensor_parallel_size=2), True),
                                    (dict(data_parallel_size=2), False)):
        build_engine(EngineConfig.from_options("random:tiny-llama", device="cpu", **options),
                     engine_process=engine_process)
    assert built == ["process", "here", "here", "process"]


def test_ctrl_c_stops_the_server_and_its_engine_process_quietly(tiny_model_dir, tmp_path):
    log = tmp_path / "server.log"
    proc, _ = start_server(tiny_model_dir, log, ["--max-model-len", "64"], new_session=True)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole group
        proc.wait(timeout=60)
    finally:
        stop_server(proc)
    text = log.read_text()
    assert "started up in" in text  # the engine process's log line, in the server's log
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "Finished server process" in text


def test_a_killed_engine_process_fails_requests_and_health(tiny_model_dir):
    config = EngineConfig.from_options(str(tiny_model_dir), device="cpu", block_size=16,
                                       max_model_len=64, num_gpu_blocks=32)
    engine = build_engine(config, engine_process=True)
    with app_client(engine) as client:
        resp = client.post("/v1/completions", json={**BODY, "prompt": PROMPTS[0]})
        assert resp.status_code == 200
        os.kill(engine._processes[0].pid, signal.SIGKILL)  # the OOM killer, say
        resp = client.post("/v1/completions", json={**BODY, "prompt": PROMPTS[0]})
        assert resp.status_code == 503, resp.text
        assert "the engine process exited unexpectedly" in resp.json()["error"]["message"]
        assert client.get("/health").status_code == 503


def test_the_stats_read_idle_once_the_request_aborted_last_is_gone(tiny_model_dir):
    """The engine thread waits for the engine process to report the state an abort left it in
    before it sleeps: the stats /metrics reads then show nothing running and every block free."""
    config = EngineConfig.from_options(str(tiny_model_dir), device="cpu", block_size=16,
                                       max_model_len=64, num_gpu_blocks=32)
    async_engine = AsyncEngine(build_engine(config, engine_process=True))
    async_engine.start()
    params = SamplingParams(max_tokens=48, ignore_eos=True, output_kind=RequestOutputKind.DELTA)

    async def leave_after_two_outputs() -> None:
        [stream] = await async_engine.submit([GenerateRequest("left", PROMPTS[0], params)])
        for _ in range(2):
            assert not (await anext(stream)).finished
        stream.abort()

    try:
        asyncio.run(leave_after_two_outputs())
        deadline = time.monotonic() + 20
        while (stats := async_engine.stats())["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats["running"] == stats["waiting"] == stats["swapped"] == 0, stats
        assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"], stats
        assert 2 <= stats["generation_tokens"] < params.max_tokens
    finally:
        async_engine.shutdown()
