"""The server in front of two data-parallel replicas: a batch of prompts (which makes both
replicas swap), concurrent and streamed requests get the texts one engine gives them, /metrics
labels each replica and the shared flash device, and shutting down stops the replica
processes."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from hifc import LLM, SamplingParams
from hifc.config import EngineConfig
from hifc.parallel.data_parallel import build_engine
from tests.server.helpers import app_client, metric_values

pytestmark = pytest.mark.slow  # two replica processes (~10 s to start on the CPU VM)

PROMPTS = [f"Flash memory {word} the key value cache" for word in
           ("keeps", "swaps", "writes", "reads", "holds", "moves", "erases", "pages")]
MAX_TOKENS = 20


def test_two_replicas_serve_what_one_engine_gives(tiny_model_dir, tmp_path):
    options = dict(device="cpu", block_size=16, max_model_len=64)
    with LLM(str(tiny_model_dir), num_gpu_blocks=64, **options) as one:
        expected = [o.text for o in one.generate(PROMPTS, SamplingParams(
            max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True), use_tqdm=False)]
    # 5 blocks per replica for 4 sequences of 2 blocks each: the replicas swap to flash
    config = EngineConfig.from_options(
        str(tiny_model_dir), num_gpu_blocks=5, kv_offload="flash", flash_size_gib=0.01,
        flash_path=str(tmp_path / "kv-{replica}.hifc"), data_parallel_size=2, **options)
    engine = build_engine(config)
    with app_client(engine) as client:
        def complete(prompt: str) -> str:
            resp = client.post("/v1/completions", json={
                "model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True})
            assert resp.status_code == 200, resp.text
            return resp.json()["choices"][0]["text"]

        # one request of all the prompts: they reach the replicas together, four sequences on
        # each, whose second blocks do not fit beside each other: both replicas swap
        resp = client.post("/v1/completions", json={
            "model": "m", "prompt": PROMPTS, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True})
        assert resp.status_code == 200, resp.text
        assert [c["text"] for c in sorted(resp.json()["choices"], key=lambda c: c["index"])] \
            == expected
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            assert list(pool.map(complete, PROMPTS)) == expected
        with client.stream("POST", "/v1/completions", json={
                "model": "m", "prompt": PROMPTS[3], "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True}) as resp:
            events = [line[len("data: "):] for line in resp.iter_lines()
                      if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == expected[3]
        values = metric_values(client.get("/metrics").text)
    # leaving the client shuts the server's engine thread down, which closes the replicas
    assert all(not p.is_alive() and p.exitcode == 0 for p in engine._processes)
    per_replica = [values[f'hifc_replica_generation_tokens_total{{replica={i}}}'] for i in (0, 1)]
    assert all(n > 0 for n in per_replica)
    assert values['vllm:generation_tokens_total{model_name=m}'] == sum(per_replica)
    written = [v for k, v in values.items() if k.startswith("hifc_flash_device_swap_out_bytes")]
    assert len(written) == 1 and written[0] > 0
    assert all(values[f'hifc_replica_preemptions_total{{replica={i}}}'] > 0 for i in (0, 1))
