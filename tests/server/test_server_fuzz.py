"""Random combinations of the API's options, several requests at once, against the real server:
each answer is a 200 or a 4xx in the OpenAI error format, never a 5xx or a broken stream; a
greedy request gives the same text streamed and not; a finished constrained output keeps its
constraint; afterwards the server is healthy and every KV block is free."""
from __future__ import annotations

import json
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.helpers import MODEL_NAME, wait_until_idle

NUM_REQUESTS = 240
C, CHAT = "/v1/completions", "/v1/chat/completions"
OPTIONS = {  # each request takes a few, each one value (some of them wrong)
    "max_tokens": [1, 3, 6, 0, "3", 10 ** 9], "temperature": [0.5, 1.0, 2.0, -1, 101],
    "top_p": [0.1, 0.9, 0, 1.01], "top_k": [-1, 1, 5, 10 ** 7], "min_p": [0.1, 1, -0.1],
    "seed": [0, 7, 2 ** 63 - 1, 2 ** 64], "n": [1, 2, 3, 0],
    "stream_options": [{"include_usage": True}, {"include_usage": False}],
    "stop": ["a", ["a", "b"], "", ["x"] * 5], "stop_token_ids": [[0], [1, 2], []],
    "ignore_eos": [True, False], "logprobs": [0, 1, 5, 20, True], "top_logprobs": [0, 1, 5, 21],
    "prompt_logprobs": [0, 1, 5], "presence_penalty": [0, 1.5, -2.5],
    "frequency_penalty": [0, 1.0], "repetition_penalty": [1.3, 0.5, 0],
    "logit_bias": [{"5": 10.0}, {"5": -100}, {}], "allowed_token_ids": [[5, 6, 7], [1]],
    "bad_words": [["a"], ["hello world"]], "min_tokens": [0, 1, 3],
    "echo": [True, False], "skip_special_tokens": [True, False],
    "include_stop_str_in_output": [True, False], "return_token_ids": [True, False],
    "response_format": [{"type": "json_object"}, {"type": "text"}, {"type": "xml"}],
    "guided_regex": ["[ab]+", "a{2,3}", "("], "guided_choice": [["yes", "no"], []],
    "add_generation_prompt": [True, False], "continue_final_message": [True, False],
}
PROMPTS = ["Hello", "The quick brown fox", [5, 6, 7, 8], ["a", "b"], "x " * 100, ""]
MESSAGES = [[{"role": "user", "content": "Hi"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
            [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], []]
CONFLICTING = ("allowed_token_ids", "bad_words", "logit_bias", "stop", "echo",
               "include_stop_str_in_output")  # may keep a constrained text from its form


def random_request(rng: random.Random) -> tuple[str, dict]:
    chat = rng.random() < 0.5
    body = {"model": MODEL_NAME}
    if chat:
        body["messages"] = rng.choice(MESSAGES)
    else:
        body["prompt"] = rng.choice(PROMPTS)
    for name in rng.sample(sorted(OPTIONS), rng.randint(0, 6)):
        body[name] = rng.choice(OPTIONS[name])
    body.setdefault("max_tokens", rng.choice([1, 3, 6]))
    if rng.random() < 0.5:
        body["temperature"] = 0
    body["stream"] = rng.random() < 0.4
    return (CHAT if chat else C), body


def choices(path: str, body: dict, raw: str) -> dict[int, tuple[str, str | None]]:
    """Choice index -> (its text, its finish reason), from a JSON answer or a whole event stream
    (which must end with [DONE] and carry no error event)."""
    chat = path == CHAT
    if not body["stream"]:
        return {c["index"]: ((c["message"]["content"] or "") if chat else c["text"],
                             c["finish_reason"]) for c in json.loads(raw)["choices"]}
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", raw[-300:]
    out: dict[int, tuple[str, str | None]] = {}
    for event in map(json.loads, events[:-1]):
        assert "error" not in event, event
        for c in event["choices"]:
            piece = (c.get("delta", {}).get("content") or "") if chat else c["text"]
            text, finish = out.get(c["index"], ("", None))
            out[c["index"]] = (text + piece, c.get("finish_reason") or finish)
    return out


def texts(found: dict[int, tuple[str, str | None]]) -> dict[int, str]:
    """Choice index -> its text, from what ``choices`` found."""
    return {index: text for index, (text, _) in found.items()}


def post(http: httpx.Client, path: str, body: dict) -> tuple[int, str]:
    if body["stream"]:
        with http.stream("POST", path, json=body) as resp:
            return resp.status_code, "".join(resp.iter_text())
    resp = http.post(path, json=body)
    return resp.status_code, resp.text


def check_constraint(body: dict, text: str, finish: str | None) -> None:
    if finish != "stop" or any(name in body for name in CONFLICTING):
        return
    if "guided_choice" in body:
        assert text in body["guided_choice"], (body, text)
    if "guided_regex" in body:
        assert re.fullmatch(body["guided_regex"], text), (body, text)
    if body.get("response_format", {}).get("type") == "json_object":
        json.loads(text)


def check(http: httpx.Client, path: str, body: dict, status: int, raw: str) -> None:
    assert status in (200, 400), (status, body, raw[:500])
    if status == 400:
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
        return
    found = choices(path, body, raw)
    got = texts(found)
    assert sorted(got) == list(range(len(got))) and got, (body, raw[:300])
    for text, finish in found.values():
        check_constraint(body, text, finish)
    if body.get("temperature") == 0 and body.get("n", 1) == 1:  # the same text the other way
        other = {**body, "stream": not body["stream"]}
        other.pop("stream_options", None)
        status, again = post(http, path, other)
        assert status == 200 and texts(choices(path, other, again)) == got, (body, raw, again)


@pytest.mark.parametrize("seed", range(8))
def test_random_requests_get_answers_or_clear_errors(server, seed):
    rng = random.Random(seed)
    requests = [random_request(rng) for _ in range(NUM_REQUESTS)]
    local, clients = threading.local(), []

    def run(request: tuple[str, dict]) -> None:
        if not hasattr(local, "http"):
            local.http = server.client()
            clients.append(local.http)
        path, body = request
        check(local.http, path, body, *post(local.http, path, body))

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(run, requests))
    finally:
        for http in clients:
            http.close()
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    values = wait_until_idle(server)
    assert values["hifc_gpu_kv_blocks_free"] == values["hifc_gpu_kv_blocks_total"]
