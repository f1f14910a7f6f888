"""The server with the flash prefix store: /metrics reports its counters, and a clean shutdown
writes the cached GPU blocks the store lacks, so that the next server starts warm."""
from __future__ import annotations

from hifc.engine.llm_engine import LLMEngine
from tests.server.helpers import app_client, metric_values

PROMPT = list(range(5, 5 + 70))  # token ids: 4 full blocks of 16 and a partial one
STORE_COUNTERS = ("hifc_prefix_store_queries_total", "hifc_prefix_store_hits_total",
                  "hifc_prefix_store_recomputed_total", "hifc_prefix_store_bytes_read_total",
                  "hifc_prefix_store_bytes_written_total")


def _engine(path) -> LLMEngine:
    return LLMEngine.from_options(
        "random:tiny-llama", device="cpu", block_size=16, max_model_len=128, num_gpu_blocks=16,
        kv_offload="flash", flash_path=str(path), flash_size_gib=0.01,
        prefix_store_read="always")


def _complete_and_scrape(client) -> dict[str, float]:
    resp = client.post("/v1/completions", json={"model": "m", "prompt": PROMPT,
                                                "max_tokens": 3, "ignore_eos": True})
    assert resp.status_code == 200
    return metric_values(client.get("/metrics").text)


def test_metrics_show_the_store_and_shutdown_flushes_it(tmp_path):
    path = tmp_path / "kv.hifc"
    with app_client(_engine(path)) as client:
        values = _complete_and_scrape(client)
    for name in STORE_COUNTERS:
        assert name in values, name
    assert values["hifc_prefix_store_hits_total"] == 0  # a new file
    assert values["hifc_prefix_store_blocks"] == 0  # nothing evicted: nothing written yet
    with app_client(_engine(path)) as client:  # the first server's shutdown wrote the blocks
        values = _complete_and_scrape(client)
    assert values["hifc_prefix_store_blocks"] >= 4
    assert values["hifc_prefix_store_hits_total"] == 4 * 16
    assert values["hifc_prefix_store_bytes_read_total"] > 0
    assert values["hifc_prefix_store_recomputed_total"] == 0
