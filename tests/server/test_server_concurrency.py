"""Fifty concurrent streaming clients, some of them leaving midway: afterwards no request runs,
waits or is swapped, every KV block is free, and /health stays 200."""
from __future__ import annotations

import asyncio
import json

import httpx

from tests.server.helpers import MODEL_NAME, metric_values, wait_until_idle

NUM_CLIENTS = 50
MAX_TOKENS = 40


async def _stream(http: httpx.AsyncClient, i: int, leave_after: int | None) -> dict:
    """Stream one completion; leave after ``leave_after`` chunks (None: read to the end)."""
    chat = i % 2 == 1
    body = {"model": MODEL_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": i,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": f"Client {i} asks about flash."}]
    else:
        body["prompt"] = f"Client {i}: the key value cache"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    chunks, usage, done = 0, None, False
    async with http.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            assert "error" not in event, event
            chunks += 1
            usage = event.get("usage") or usage
            if leave_after is not None and chunks >= leave_after:
                break  # leaving the block closes the connection mid-stream
    return {"done": done, "usage": usage, "chunks": chunks}


async def _leave_non_streaming(http: httpx.AsyncClient, i: int) -> None:
    """A non-streaming request whose client gives up before the answer."""
    body = {"model": MODEL_NAME, "prompt": f"Impatient {i}", "max_tokens": 200,
            "ignore_eos": True}
    try:
        await http.post("/v1/completions", json=body, timeout=0.3)
    except httpx.TimeoutException:
        pass


async def _health_during(http: httpx.AsyncClient, polls: int = 5) -> list[int]:
    codes = []
    for _ in range(polls):
        await asyncio.sleep(0.05)
        codes.append((await http.get("/health")).status_code)
    return codes


async def _run_clients(server) -> tuple[list[dict], list[int]]:
    limits = httpx.Limits(max_connections=NUM_CLIENTS + 10)
    async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, timeout=60,
                                 limits=limits) as http:
        leavers = [_leave_non_streaming(http, i) for i in range(4)]
        streams = [_stream(http, i, leave_after=(2 + i % 5) if i % 3 == 0 else None)
                   for i in range(NUM_CLIENTS)]
        results = await asyncio.wait_for(
            asyncio.gather(*streams, *leavers, _health_during(http)), timeout=80)
        return results[:NUM_CLIENTS], results[-1]


def test_fifty_streams_with_disconnects_leave_nothing_allocated(server):
    before = metric_values(httpx.get(f"{server.base_url}/metrics").text)
    results, health_codes = asyncio.run(_run_clients(server))
    assert health_codes == [200] * len(health_codes)

    finished = [r for i, r in enumerate(results) if i % 3 != 0]
    assert all(r["done"] and r["usage"]["completion_tokens"] == MAX_TOKENS for r in finished)
    left = [r for i, r in enumerate(results) if i % 3 == 0]
    assert all(not r["done"] for r in left)

    after = wait_until_idle(server)
    labels = f"{{model_name={MODEL_NAME}}}"
    assert after[f"vllm:num_requests_running{labels}"] == 0
    assert after[f"vllm:num_requests_waiting{labels}"] == 0
    assert after["hifc_num_requests_swapped"] == 0
    assert after["hifc_gpu_kv_blocks_free"] == after["hifc_gpu_kv_blocks_total"]
    assert after["hifc_tier_blocks_used"] == 0
    # the load overflowed the KV pool: sequences were preempted and swapped to the DRAM tier
    preemptions = f"vllm:num_preemptions_total{labels}"
    assert after[preemptions] > before[preemptions]
    assert after["hifc_swap_out_blocks_total"] > before["hifc_swap_out_blocks_total"]
    done = f"vllm:request_success_total{{finished_reason=length,model_name={MODEL_NAME}}}"
    done_before, done_after = before.get(done, 0), after[done]
    # every stream read to its end is counted; a client that left may have left only after the
    # server had finished its request (a loaded machine can run the client behind the server)
    assert len(finished) <= done_after - done_before <= len(finished) + len(left)
    assert httpx.get(f"{server.base_url}/health").status_code == 200
