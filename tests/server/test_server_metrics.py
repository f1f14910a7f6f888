"""/metrics parses with the Prometheus text parser and its counters move as requests complete."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.helpers import MODEL_NAME, NUM_GPU_BLOCKS, metric_values, wait_until_idle

ENGINE_GAUGES = ("hifc_num_requests_running", "hifc_num_requests_waiting",
                 "hifc_num_requests_swapped", "hifc_gpu_kv_blocks_free",
                 "hifc_gpu_kv_blocks_total", "hifc_gpu_kv_cache_usage_ratio",
                 "hifc_tier_blocks_used", "hifc_tier_blocks_total", "hifc_tier_usage_ratio")
ENGINE_COUNTERS = ("hifc_prompt_tokens", "hifc_generation_tokens", "hifc_preemptions",
                   "hifc_swap_out_blocks", "hifc_swap_in_blocks", "hifc_tier_bytes_written",
                   "hifc_tier_bytes_read", "hifc_recomputed_sequences", "hifc_swap_stall_seconds",
                   "hifc_swap_out_stall_seconds")
HISTOGRAMS = ("hifc_time_to_first_token_seconds", "hifc_time_per_output_token_seconds",
              "hifc_e2e_request_latency_seconds")


def _scrape(server) -> str:
    resp = httpx.get(f"{server.base_url}/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return resp.text


def test_metrics_parse_and_name_the_engine_state(server):
    families = {f.name: f for f in text_string_to_metric_families(_scrape(server))}
    for name in ENGINE_GAUGES:
        assert families[name].type == "gauge", name
    for name in ENGINE_COUNTERS:
        assert families[name].type == "counter", name
    for name in HISTOGRAMS:
        assert families[name].type == "histogram", name
    values = metric_values(_scrape(server))
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
    assert (after["hifc_prompt_tokens_total"] - before["hifc_prompt_tokens_total"]
            == sum(u["prompt_tokens"] for u in usage))
    assert (after["hifc_generation_tokens_total"] - before["hifc_generation_tokens_total"]
            == n * max_tokens)
    key = f"hifc_request_success_total{{finished_reason=length,model_name={MODEL_NAME}}}"
    assert after[key] - before.get(key, 0) == n
    for name in HISTOGRAMS:
        count = f"{name}_count{{model_name={MODEL_NAME}}}"
        assert after[count] - before.get(count, 0) == n, name
    assert after["hifc_gpu_kv_cache_usage_ratio"] == 0
