"""vLLM's sampling fields through the official openai client against a real server: n,
logprobs, echo, penalties, min_tokens, stop reasons, batched prompts, guided choice, streaming
and not; return_token_ids; unknown fields ignored with a logged warning; /tokenize,
/detokenize, /version."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.helpers import MODEL_NAME

GREEDY = {"ignore_eos": True}


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key,
                       max_retries=0, timeout=30) as c:
        yield c


def test_completions_with_n_logprobs_echo_and_batched_prompts(client):
    prompts = ["The quick brown fox", "Flash memory"]
    r = client.completions.create(
        model=MODEL_NAME, prompt=prompts, n=2, max_tokens=5, temperature=1.0, seed=9,
        logprobs=2, echo=True, presence_penalty=0.5, frequency_penalty=0.5,
        extra_body={"min_tokens": 5, "repetition_penalty": 1.2, "min_p": 0.01, **GREEDY})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 4 * 5
    for choice in r.choices:
        prompt = prompts[choice.index // 2]
        assert choice.text.startswith(prompt) and choice.finish_reason == "length"
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == \
            len(lp.text_offset)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # first prompt token
        generated = lp.top_logprobs[-5:]
        assert all(1 <= len(top) <= 3 for top in generated)  # chosen token + top 2
        assert all(v <= 0 for v in lp.token_logprobs[1:])
        assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    again = client.completions.create(
        model=MODEL_NAME, prompt=prompts, n=2, max_tokens=5, temperature=1.0, seed=9,
        logprobs=2, echo=True, presence_penalty=0.5, frequency_penalty=0.5,
        extra_body={"min_tokens": 5, "repetition_penalty": 1.2, "min_p": 0.01, **GREEDY})
    assert [c.text for c in again.choices] == [c.text for c in r.choices]


def test_stop_reason_is_the_stop_token_or_string(client):
    free = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=6,
                                     temperature=0, extra_body={"prompt_logprobs": 0,
                                                                **GREEDY}).choices[0]
    assert free.model_extra["stop_reason"] is None and free.finish_reason == "length"
    prompt_logprobs = free.model_extra["prompt_logprobs"]  # vLLM's extra: k = 0, the token's
    assert prompt_logprobs[0] is None and all(len(p) == 1 for p in prompt_logprobs[1:])
    assert all(e["rank"] >= 1 and e["logprob"] <= 0 for p in prompt_logprobs[1:]
               for e in p.values())
    stop = free.text[2:4]
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=6,
                                  temperature=0, stop=[stop], extra_body=GREEDY).choices[0]
    assert r.finish_reason == "stop" and r.model_extra["stop_reason"] == stop
    assert r.text == free.text[:free.text.index(stop)]
    kept = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=6,
                                     temperature=0, stop=[stop], extra_body={
                                         "include_stop_str_in_output": True, **GREEDY})
    assert kept.choices[0].text == free.text[:free.text.index(stop) + len(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_n_and_guided_choice(client, stream):
    kwargs = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "Pick one."}],
                  n=2, max_completion_tokens=8, temperature=1.0, seed=4, logprobs=True,
                  top_logprobs=3, extra_body={"guided_choice": ["flash", "dram", "disk"]})
    texts, positions = {0: "", 1: ""}, {0: [], 1: []}
    finish = {}
    if stream:
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
                if c.logprobs is not None:
                    positions[c.index] += c.logprobs.content
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
    else:
        for c in client.chat.completions.create(**kwargs).choices:
            texts[c.index], positions[c.index] = c.message.content, c.logprobs.content
            finish[c.index] = c.finish_reason
    assert finish == {0: "stop", 1: "stop"}
    for index in (0, 1):
        assert texts[index] in ("flash", "dram", "disk")
        assert positions[index] and all(len(p.top_logprobs) == 3 for p in positions[index])
        assert all(p.top_logprobs[0].logprob >= p.top_logprobs[1].logprob
                   for p in positions[index])


def test_streamed_batch_of_prompts_finishes_every_choice(client):
    chunks = list(client.completions.create(
        model=MODEL_NAME, prompt=["One", "Two", "Three"], n=2, max_tokens=4, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body=GREEDY))
    finished = sorted(c.choices[0].index for c in chunks if c.choices and
                      c.choices[0].finish_reason == "length")
    assert finished == list(range(6))
    assert chunks[-1].usage.completion_tokens == 6 * 4
    texts = {}
    for c in chunks:
        if c.choices:
            texts[c.choices[0].index] = texts.get(c.choices[0].index, "") + c.choices[0].text
    assert texts[0] == texts[1] and texts[2] == texts[3]  # greedy: n copies agree


def _stream_events(http: httpx.Client, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        return [json.loads(line[6:]) for line in resp.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


def test_completion_return_token_ids_streamed_and_whole(server, client):
    free = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=8,
                                     temperature=0, extra_body=GREEDY).choices[0].text
    body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 8, "temperature": 0,
            "stop": [free[3:5]], **GREEDY}  # a stop string: text is held back, ids are not
    with server.client() as http:
        whole = http.post("/v1/completions", json={**body, "return_token_ids": True}).json()
        events = _stream_events(http, "/v1/completions", {**body, "return_token_ids": True})
        plain = _stream_events(http, "/v1/completions", body)
    choice = whole["choices"][0]
    assert len(choice["token_ids"]) == whole["usage"]["completion_tokens"]
    assert len(choice["prompt_token_ids"]) == whole["usage"]["prompt_tokens"]
    chunks = [e["choices"][0] for e in events]
    assert all(isinstance(c["token_ids"], list) for c in chunks)
    assert [c.get("prompt_token_ids") for c in chunks] == \
        [choice["prompt_token_ids"]] + [None] * (len(chunks) - 1)  # first chunk only
    assert sum((c["token_ids"] for c in chunks), []) == choice["token_ids"]
    assert "".join(c["text"] for c in chunks) == choice["text"] == \
        "".join(e["choices"][0]["text"] for e in plain)
    assert not any("token_ids" in e["choices"][0] for e in plain)  # only when asked


def test_chat_return_token_ids_streamed_and_whole(server):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 6, "temperature": 0, "return_token_ids": True, **GREEDY}
    with server.client() as http:
        whole = http.post("/v1/chat/completions", json=body).json()
        events = _stream_events(http, "/v1/chat/completions", body)
    assert len(whole["prompt_token_ids"]) == whole["usage"]["prompt_tokens"]
    assert len(whole["choices"][0]["token_ids"]) == 6
    assert events[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == \
        whole["choices"][0]["token_ids"]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == \
        whole["choices"][0]["message"]["content"]


def test_unknown_fields_are_ignored_with_a_warning(client, server):
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        metadata={"team": "a"}, extra_body={"frobnicate": 1, **GREEDY})
    assert r.choices[0].finish_reason == "length"
    log = server.log_path.read_text()
    assert "ignored: ['frobnicate', 'metadata']" in log


def test_tokenize_detokenize_and_version(server):
    with server.client() as http:
        tokens = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": "Hello world",
                                              "return_token_strs": True}).json()
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 256
        assert "".join(tokens["token_strs"]).endswith("Hello world")
        text = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
        assert text.endswith("Hello world")
        chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200 and chat.json()["count"] > 3
        assert http.post("/tokenize", json={}).status_code == 400
        assert http.post("/detokenize", json={"tokens": [10 ** 7]}).status_code == 400
    assert httpx.post(f"{server.base_url}/tokenize", json={"prompt": "x"}).status_code == 401
    from hifc import __version__
    assert httpx.get(f"{server.base_url}/version").json() == {"version": __version__}
