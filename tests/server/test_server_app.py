"""The app in-process (no socket): models without a chat template or tokenizer, who may use
the server (API key, exposure beyond loopback), and engine-thread behaviour."""
from __future__ import annotations

import json
import shutil
import time

import pytest
from fastapi.testclient import TestClient

from hifc.engine.llm_engine import LLMEngine
from hifc.entrypoints.server.access import check_exposure, resolve_api_key
from tests.server.helpers import app_client, metric_values


def _client(model: str, name: str = "m", **settings) -> TestClient:
    engine = LLMEngine.from_options(model, device="cpu", block_size=16, max_model_len=128,
                                    num_gpu_blocks=16)
    return app_client(engine, name, **settings)


@pytest.fixture(scope="module")
def no_template_dir(tmp_path_factory, tiny_model_dir):
    path = tmp_path_factory.mktemp("no-template") / "tiny"
    shutil.copytree(tiny_model_dir, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    return path


def test_chat_without_template_is_400_and_completions_still_work(no_template_dir):
    with _client(str(no_template_dir)) as client:
        resp = client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 400
        assert "chat template" in resp.json()["error"]["message"]
        ok = client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_server_chat_template_replaces_the_models(no_template_dir):
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    with _client(str(no_template_dir), chat_template=template) as client:
        messages = [{"role": "user", "content": "hi"}]
        resp = client.post("/v1/chat/completions", json={"model": "m", "messages": messages,
                                                         "max_tokens": 2})
        assert resp.status_code == 200, resp.text
        ids = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
        assert client.post("/detokenize", json={"tokens": ids}).json()["prompt"] == "<user>hi"
        own = client.post("/tokenize", json={"messages": messages,
                                             "chat_template": "{{ messages[0]['content'] }}!"})
        assert client.post("/detokenize", json={"tokens": own.json()["tokens"]}).json() == \
            {"prompt": "hi!"}


def test_model_without_tokenizer_takes_token_ids_only():
    with _client("random:tiny-llama") as client:
        chat = client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 400 and "no tokenizer" in chat.json()["error"]["message"]
        text = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert text.status_code == 400 and "token ids" in text.json()["error"]["message"]
        ids = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3],
                                                   "max_tokens": 3, "ignore_eos": True})
        assert ids.status_code == 200
        assert ids.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 3,
                                       "total_tokens": 6,
                                       "prompt_tokens_details": {"cached_tokens": 0}}
        assert client.get("/health").status_code == 200


def test_repeated_prompt_reports_cached_tokens_in_usage_and_metrics():
    prompt = list(range(3, 43))  # 40 tokens: two full blocks of 16 can be reused
    body = {"model": "m", "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    with _client("random:tiny-llama") as client:
        first = client.post("/v1/completions", json=body).json()["usage"]
        second = client.post("/v1/completions", json=body).json()["usage"]
        deadline = time.monotonic() + 30
        while True:  # the engine thread publishes its stats after the step that finished
            metrics = metric_values(client.get("/metrics").text)
            idle = metrics["hifc_gpu_kv_blocks_free"] == metrics["hifc_gpu_kv_blocks_total"]
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"] == {"cached_tokens": 32}
    assert metrics["vllm:prefix_cache_queries_total{model_name=m}"] == 80
    assert metrics["vllm:prefix_cache_hits_total{model_name=m}"] == 32
    assert idle and metrics["hifc_gpu_kv_blocks_cached"] == 2  # free, still cached


def test_after_shutdown_health_and_requests_are_503():
    client = _client("random:tiny-llama")
    with client:  # lifespan: the engine thread starts, and stops on exit
        assert client.get("/health").status_code == 200
    assert client.get("/health").status_code == 503
    resp = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2]})
    assert resp.status_code == 503 and "not running" in resp.json()["error"]["message"]


def test_engine_failure_fails_requests_and_health_but_not_the_server():
    client = _client("random:tiny-llama")
    engine = client.app.state.async_engine.engine

    def broken_step():
        raise RuntimeError("simulated engine bug")

    engine.step = broken_step
    with client:
        resp = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2],
                                                    "max_tokens": 2})
        assert resp.status_code == 503 and "simulated engine bug" in resp.json()["error"]["message"]
        assert client.get("/health").status_code == 503
        assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("host,key,exposed", [
    ("127.0.0.1", None, False), ("localhost", None, False), ("::1", None, False),
    ("0.0.0.0", None, True), ("::", None, True), ("192.168.1.10", None, True),
    ("example.org", None, True), ("0.0.0.0", "secret", False)])
def test_serving_beyond_loopback_without_key_is_refused_unless_allowed(host, key, exposed):
    if exposed:
        with pytest.raises(ValueError, match=f"--host {host}: refusing .* --allow-unauthenticated"):
            check_exposure(host, key, allow_unauthenticated=False)
        warning = check_exposure(host, key, allow_unauthenticated=True)
        assert "without an API key" in warning and host in warning
    else:
        assert check_exposure(host, key, allow_unauthenticated=False) is None


def test_api_key_from_flag_file_or_environment(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    env = {"HIFC_API_KEY": "from-env"}
    assert resolve_api_key(None, str(key_file), env) == "from-file"
    assert resolve_api_key("from-flag", None, env) == "from-flag"
    assert resolve_api_key(None, None, env) == "from-env"
    assert resolve_api_key(None, None, {"HIFC_API_KEY": ""}) is None
    with pytest.raises(ValueError, match="not both"):
        resolve_api_key("a", str(key_file), {})
    key_file.write_text("\n")
    with pytest.raises(ValueError, match="holds no key"):
        resolve_api_key(None, str(key_file), {})
    with pytest.raises(FileNotFoundError):
        resolve_api_key(None, str(tmp_path / "missing"), {})


def test_serve_takes_the_model_as_positional_or_option():
    from hifc.entrypoints.cli import build_parser

    args = build_parser().parse_args(["serve", "some/model", "--port", "9001"])
    assert args.model_tag == "some/model" and args.port == 9001 and args.host == "127.0.0.1"
    args = build_parser().parse_args(["serve", "--model", "m", "--served-model-name", "a", "b",
                                      "--kv-offload", "dram", "--swap-space", "1"])
    assert args.model == "m" and args.served_model_name == ["a", "b"]
    assert args.kv_offload == "dram"


def test_serve_runs_with_the_engine_startup_heap_frozen(monkeypatch):
    """The server handles requests with the engine's start-up state out of the collector's
    reach, unfrozen when it stops."""
    import gc

    import uvicorn

    from hifc.entrypoints.cli import build_parser

    frozen = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: frozen.append(gc.get_freeze_count()))
    args = build_parser().parse_args(["serve", "--model", "random:tiny-llama", "--device", "cpu",
                                      "--port", "9001"])
    assert args.func(args) == 0
    assert len(frozen) == 1 and frozen[0] > 0 and gc.get_freeze_count() == 0


def test_whole_responses_ask_for_the_final_output_only_and_streams_for_what_each_step_adds():
    """A response sent whole needs one output per request (``output_kind`` FINAL_ONLY): the
    engine builds no snapshot per step for it; a stream takes what each step added (DELTA)."""
    from hifc.sampling_params import RequestOutputKind

    engine = LLMEngine.from_options("random:tiny-llama", device="cpu", block_size=16,
                                    max_model_len=128, num_gpu_blocks=16)
    kinds = []
    add = engine.add_request

    def recording_add(request_id, prompt, params=None, **kwargs):
        kinds.append(params.output_kind)
        return add(request_id, prompt, params, **kwargs)

    engine.add_request = recording_add
    with app_client(engine, "m") as client:
        body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True}
        whole = client.post("/v1/completions", json=body)
        assert whole.status_code == 200 and whole.json()["usage"]["completion_tokens"] == 4
        streamed = client.post("/v1/completions", json={**body, "stream": True})
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert kinds == [RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA]
