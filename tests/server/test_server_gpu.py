"""The server on a CUDA GPU: the engine thread runs Triton kernels and replays CUDA graphs (the
graphs were captured in another thread), while swapping to the flash tier; and the same with
the engine in a process of its own (``hifc serve``'s default)."""
from __future__ import annotations

import concurrent.futures as cf

import pytest
import torch
from fastapi.testclient import TestClient

from hifc import LLM, SamplingParams
from hifc.config import EngineConfig
from hifc.engine.llm_engine import LLMEngine
from hifc.parallel.data_parallel import build_engine
from tests.runtime.helpers import random_prompts
from tests.server.helpers import app_client

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

COMMON = dict(device="cuda", dtype="bfloat16", block_size=16, max_model_len=128,
              max_num_seqs=8)


def _complete(client: TestClient, ids: list[int], max_tokens: int) -> str:
    resp = client.post("/v1/completions", json={
        "model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["completion_tokens"] == max_tokens
    return body["choices"][0]["text"]


@pytest.mark.parametrize("engine_process", [False, True])
def test_server_on_cuda_with_graphs_and_flash_swaps(tmp_path, tiny_model_dir, engine_process):
    model = str(tiny_model_dir)  # a tiny HF model with a tokenizer (tests/server/conftest.py)
    prompts = random_prompts(8, (20, 60), seed=0, vocab=300)
    alone = LLM(model, num_gpu_blocks=64, **COMMON).generate(
        [prompts[0]], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
        use_tqdm=False)[0]

    config = EngineConfig.from_options(model, num_gpu_blocks=12, kv_offload="flash",
                                       flash_path=str(tmp_path / "kv.hifc"), flash_size_gib=0.01,
                                       **COMMON)
    engine = build_engine(config, engine_process=engine_process)
    if not engine_process:
        assert isinstance(engine, LLMEngine)
        assert engine.runner.decode_graphs.graphs  # captured here, replayed in the engine thread
    with app_client(engine, "m") as client:
        # one request alone decodes at batch 1 as the offline run did: the same tokens
        assert _complete(client, prompts[0], 24) == alone.text
        with cf.ThreadPoolExecutor(8) as pool:  # 8 at once do not fit 12 blocks: swaps
            list(pool.map(lambda ids: _complete(client, ids, 40), prompts))
        stats = client.app.state.async_engine.stats()
    assert stats["graph_decode_steps"] > 0 and stats["swap_out_blocks"] > 0
    assert stats["swap_in_blocks"] == stats["swap_out_blocks"]
    assert stats["gpu_blocks_free"] == stats["gpu_blocks_total"]
    assert stats["tier_blocks_used"] == 0
