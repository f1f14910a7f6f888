"""/metrics parses with the Prometheus text parser and its counters move as requests complete."""
from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hifc.config import EngineConfig
from hifc.engine.llm_engine import LLMEngine
from hifc.entrypoints.server.async_engine import AsyncEngine
from tests.server.helpers import (MODEL_NAME, NUM_GPU_BLOCKS, app_client, metric_values,
                                  wait_until_idle)

# what means the same as in vLLM has vLLM's name and model_name label; the rest is hifc's
VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:kv_cache_usage_perc")
HIFC_GAUGES = ("hifc_num_requests_swapped", "hifc_gpu_kv_blocks_free",
               "hifc_gpu_kv_blocks_total", "hifc_tier_blocks_used", "hifc_tier_blocks_total",
               "hifc_tier_usage_ratio")
VLLM_COUNTERS = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions",
                 "vllm:request_success")
HIFC_COUNTERS = ("hifc_swap_out_blocks", "hifc_swap_in_blocks", "hifc_tier_bytes_written",
                 "hifc_tier_bytes_read", "hifc_recomputed_sequences", "hifc_swap_stall_seconds",
                 "hifc_swap_out_stall_seconds", "hifc_swap_out_blocks_freed_staged")
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
              "vllm:request_params_n")
LABELS = f"{{model_name={MODEL_NAME}}}"


def _scrape(server) -> str:
    resp = httpx.get(f"{server.base_url}/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return resp.text


def test_metrics_parse_and_name_the_engine_state(server):
    families = {f.name: f for f in text_string_to_metric_families(_scrape(server))}
    for names, kind in ((VLLM_GAUGES + HIFC_GAUGES, "gauge"),
                        (VLLM_COUNTERS + HIFC_COUNTERS, "counter"), (HISTOGRAMS, "histogram")):
        for name in names:
            assert families[name].type == kind, name
    values = metric_values(_scrape(server))
    for name in VLLM_GAUGES:
        assert f"{name}{LABELS}" in values, name
    assert values["hifc_gpu_kv_blocks_total"] == NUM_GPU_BLOCKS
    assert values["hifc_tier_blocks_total"] > 0  # the DRAM tier of the test server


def test_counters_move_as_requests_complete(server):
    before = wait_until_idle(server)
    n, max_tokens = 3, 5
    with server.client() as http:
        usage = [http.post("/v1/completions", json={
            "model": MODEL_NAME, "prompt": f"Count me {i}", "max_tokens": max_tokens,
            "ignore_eos": True}).json()["usage"] for i in range(n)]
    after = wait_until_idle(server)
    prompt, generated = f"vllm:prompt_tokens_total{LABELS}", f"vllm:generation_tokens_total{LABELS}"
    assert after[prompt] - before[prompt] == sum(u["prompt_tokens"] for u in usage)
    assert after[generated] - before[generated] == n * max_tokens
    key = f"vllm:request_success_total{{finished_reason=length,model_name={MODEL_NAME}}}"
    assert after[key] - before.get(key, 0) == n
    for name in HISTOGRAMS:
        count = f"{name}_count{LABELS}"
        assert after[count] - before.get(count, 0) == n, name
    assert after[f"vllm:kv_cache_usage_perc{LABELS}"] == 0


def test_streamed_requests_count_every_completion_s_tokens(server):
    """A stream's outputs are deltas: the request's histograms still count all its tokens
    and completions, as its usage does."""
    before = wait_until_idle(server)
    n, max_tokens = 2, 5
    with server.client() as http:
        resp = http.post("/v1/completions", json={
            "model": MODEL_NAME, "prompt": "Count me", "max_tokens": max_tokens, "n": n,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200
    events = [json.loads(line[len("data: "):]) for line in resp.text.splitlines()
              if line.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == n * max_tokens
    after = wait_until_idle(server)
    for name, grew in (("vllm:request_generation_tokens_sum", n * max_tokens),
                       ("vllm:request_params_n_sum", n), ("vllm:request_generation_tokens_count", 1)):
        assert after[f"{name}{LABELS}"] - before[f"{name}{LABELS}"] == grew, name
    key = f"vllm:request_success_total{{finished_reason=length,model_name={MODEL_NAME}}}"
    assert after[key] - before.get(key, 0) == 1


def test_a_response_s_tokens_are_counted_when_it_arrives(tiny_model_dir, monkeypatch):
    """The engine thread takes the engine's stats after a step and before it hands the step's
    outputs to their requests, so /metrics read right after a response counts its tokens."""
    engine = LLMEngine(EngineConfig.from_options(str(tiny_model_dir), device="cpu",
                                                 block_size=16, max_model_len=64,
                                                 num_gpu_blocks=32))
    client = app_client(engine)
    async_engine = client.app.state.async_engine
    at_delivery = []
    deliver = AsyncEngine._deliver

    def recording(items):
        at_delivery.append((async_engine.stats()["generation_tokens"],
                            engine.num_generated_tokens))
        deliver(items)

    monkeypatch.setattr(AsyncEngine, "_deliver", staticmethod(recording))
    with client:
        for prompt in ("Count me", "And me"):
            resp = client.post("/v1/completions", json={
                "model": "m", "prompt": prompt, "max_tokens": 4, "ignore_eos": True})
            assert resp.status_code == 200
            values = metric_values(client.get("/metrics").text)
            assert values["vllm:generation_tokens_total{model_name=m}"] == \
                engine.num_generated_tokens
    assert engine.num_generated_tokens == 8
    assert at_delivery and all(seen == actual for seen, actual in at_delivery)
