"""Malformed and hostile requests: each gets a 4xx in the OpenAI error format with a message
that says what is wrong, and the server stays healthy."""
from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.server.helpers import MAX_MODEL_LEN, MODEL_NAME, wait_until_idle

C, CHAT = "/v1/completions", "/v1/chat/completions"
MSGS = [{"role": "user", "content": "Hi"}]


def _completion(**fields):
    return {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2, **fields}


def _chat(**fields):
    return {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 2, **fields}


def _field_cases() -> list[tuple[str, dict, int, str]]:
    """(path, JSON body, status, text the message must contain)."""
    cases = []
    wrong_types = {
        "max_tokens": ["5", 2.5, True, [], {}], "temperature": ["hot", True, [0.5]],
        "top_p": ["1", False], "top_k": [1.5, "5"], "seed": ["42", 4.2], "n": ["1", 1.0],
        "stream": ["yes", 1, "false"], "stop": [5, [1, 2], {"a": 1}],
        "stop_token_ids": ["1", [1.5], ["a"]], "ignore_eos": ["true", 0],
        "stream_options": ["usage", 1], "logit_bias": ["x"], "user": [5],
        "return_token_ids": ["yes", 1, [True]],
    }
    for name, values in wrong_types.items():
        for v in values:
            for path, build in ((C, _completion), (CHAT, _chat)):
                cases.append((path, build(**{name: v}), 400, name))
    out_of_range = [
        ("max_tokens", 0, "max_tokens"), ("max_tokens", -5, "max_tokens"),
        ("temperature", -0.5, "temperature"), ("top_p", 0, "top_p"), ("top_p", 1.5, "top_p"),
        ("top_p", -1, "top_p"), ("stop_token_ids", [-1], "stop_token_ids"),
        ("seed", 2 ** 70, "seed"), ("seed", -(2 ** 70), "seed"),
        ("n", 0, "greater than or equal to 1"), ("n", 129, "less than or equal to 128"),
        ("stop", [""], "stop"),
        ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2]"),
        ("frequency_penalty", -3, "frequency_penalty must be in [-2, 2]"),
        ("repetition_penalty", 0, "repetition_penalty must be greater than zero"),
        ("min_p", 1.5, "min_p must be in [0, 1]"), ("top_k", -2, "top_k"),
        ("min_tokens", -1, "min_tokens"), ("min_tokens", 5, "min_tokens must be less than"),
        ("logit_bias", {"x": 1.0}, "logit_bias"),
        ("logit_bias", {"1000000": 1.0}, "outside the vocabulary"),
        ("allowed_token_ids", [], "allowed_token_ids"),
        ("allowed_token_ids", [10 ** 6], "outside the vocabulary"),
        ("bad_words", [""], "bad_words"), ("prompt_logprobs", -1, "prompt_logprobs"),
        ("prompt_logprobs", 21, "max_logprobs"),
        ("seed", 2 ** 80, "seed"), ("temperature", 1e300, "temperature must be at most 100"),
        ("top_k", -(10 ** 30), "top_k must be -1 or 0 (disabled), or at least 1"),
        ("top_k", 10 ** 30, "top_k must be at most the vocabulary size"),
        ("top_k", 1e30, "top_k"), ("top_k", -1e30, "top_k"),
        ("stop_token_ids", [10 ** 6], "outside the vocabulary"),
        ("stream_options", {"include_usage": True}, "stream=true"),
        ("stream_options", {"include_usage": True, "bogus": 1}, "stream=true"),
        ("response_format", {"type": "xml"}, "response_format"),
        ("response_format", {"type": "json_schema"}, "json_schema"),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema":
                                                                     {"type": "nope"}}},
         "invalid json"),
        ("guided_json", "{not json", "not valid JSON"), ("guided_regex", "(", "invalid regex"),
        ("guided_choice", [], "choice"), ("guided_grammar", "root ::= ", "invalid grammar"),
        ("structured_outputs", {"regex": "a", "choice": ["a"]}, "exactly one"),
        ("structured_outputs", {"bogus": 1}, "structured_outputs"),
    ]
    for name, v, text in out_of_range:
        for path, build in ((C, _completion), (CHAT, _chat)):
            cases.append((path, build(**{name: v}), 400, text))
    prompts = [
        ("", "empty"), ([], "empty"), ([[]], "prompt"), (["a", [1]], "prompt"),
        (["a", ""], "empty"), (["a", "x" * 2000], f"maximum model length is {MAX_MODEL_LEN}"),
        ([1, "a"], "prompt"), ([1, 2.5], "prompt"), ([10 ** 6], "outside the vocabulary"),
        ([-1], "outside the vocabulary"), ([True], "prompt"), (None, "prompt"), (5, "prompt"),
        ({"text": "x"}, "prompt"), ("x" * 2000, f"maximum model length is {MAX_MODEL_LEN}"),
        ([5] * MAX_MODEL_LEN, f"maximum model length is {MAX_MODEL_LEN}"),
    ]
    cases += [(C, _completion(prompt=p), 400, text) for p, text in prompts]
    cases += [
        (C, _completion(max_tokens=MAX_MODEL_LEN), 400, f"maximum context length is {MAX_MODEL_LEN}"),
        (C, _completion(logprobs=-1), 400, "logprobs must be a non-negative"),
        (C, _completion(logprobs=21), 400, "max_logprobs"),
        (C, _completion(guided_regex="a+", guided_choice=["a"]), 400, "one output constraint"),
        (CHAT, _chat(response_format={"type": "json_object"}, guided_regex="a"), 400,
         "one output constraint"),
        (C, _completion(best_of=3), 400, "best_of"), (C, _completion(suffix="x"), 400, "suffix"),
        (C, {"prompt": "x"}, 400, "model"), (C, {"model": MODEL_NAME}, 400, "prompt"),
        (C, _completion(model="gpt-4"), 404, "does not exist"),
        (C, _completion(model=5), 400, "model"),
        (CHAT, _chat(model="other"), 404, "does not exist"),
        (CHAT, _chat(messages=[]), 400, "messages"), (CHAT, _chat(messages="hi"), 400, "messages"),
        (CHAT, _chat(messages=[{"role": "wizard", "content": "x"}]), 400, "role"),
        (CHAT, _chat(messages=[{"content": "x"}]), 400, "role"),
        (CHAT, _chat(messages=[{"role": "user", "content": 5}]), 400, "content"),
        (CHAT, _chat(messages=[{"role": "user", "content": [{"type": "image_url",
                                                               "image_url": {"url": "x"}}]}]),
         400, "only text"),
        (CHAT, _chat(max_completion_tokens=MAX_MODEL_LEN), 400,
         f"maximum context length is {MAX_MODEL_LEN}"),
        (CHAT, _chat(messages=[{"role": "user", "content": "x " * 600}]), 400,
         f"maximum model length is {MAX_MODEL_LEN}"),
        (CHAT, _chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
        (CHAT, _chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
        (CHAT, _chat(top_logprobs=2), 400, "needs logprobs=true"),
        (CHAT, _chat(add_generation_prompt=True, continue_final_message=True), 400,
         "cannot both be true"),
        (CHAT, {"model": MODEL_NAME}, 400, "messages"),
    ]
    return cases


def _raw_cases() -> list[tuple[str, str, bytes, dict, int, str]]:
    """(method, path, raw body, extra headers, status, text)."""
    j = {"content-type": "application/json"}
    return [
        ("POST", C, b"{not json", j, 400, "not valid JSON"),
        ("POST", C, b"", j, 400, "not valid JSON"),
        ("POST", C, b"[1, 2]", j, 400, "JSON object"),
        ("POST", C, b'"hello"', j, 400, "JSON object"),
        ("POST", C, b"null", j, 400, "JSON object"),
        ("POST", C, b"\xff\xfe\x00garbage", j, 400, "not valid JSON"),
        ("POST", C, b'{"model": "' + b"a" * 70000 + b'"}', j, 413, "limit"),
        ("POST", CHAT, json.dumps(_chat(messages=[{"role": "user", "content": "y" * 70000}]))
         .encode(), j, 413, "limit"),
        ("POST", CHAT, b'{"model": ', j, 400, "not valid JSON"),
        ("POST", C, b'{"model": "x", "prompt": "a", "max_tokens": 1e999}', j, 400, "max_tokens"),
        ("POST", C, b'{"model": "%s", "prompt": "a", "temperature": 1e999}' % MODEL_NAME.encode(),
         j, 400, "temperature must be a finite number"),
        ("POST", C, b'{"model": "%s", "prompt": "a", "top_p": -1e999}' % MODEL_NAME.encode(),
         j, 400, "top_p must be a finite number"),
        ("POST", C, b"[" * 30000 + b"]" * 30000, j, 400, "nested too deeply"),
        ("POST", C, b'{"model": "x", "prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}", j, 400,
         "nested too deeply"),
        ("POST", C, b'{"model": "x", "prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}", j, 400,
         "not valid JSON"),
        ("POST", C, b'{"model": "x", "prompt": "\\ud800"}', j, 400, "invalid JSON"),
        ("GET", C, b"", {}, 405, "Method Not Allowed"),
        ("GET", "/v1/no/such/route", b"", {}, 404, "Not Found"),
        ("GET", "/v1/models/unknown-model", b"", {}, 404, "does not exist"),
        ("DELETE", "/v1/models", b"", {}, 405, "Method Not Allowed"),
        ("POST", C + "/", json.dumps(_completion()).encode(), j, 404, "Not Found"),  # no 307
        ("GET", "/v1/models/", b"", {}, 404, "does not exist"),
    ]


def _check_error(resp: httpx.Response, status: int, text: str) -> None:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert text.lower() in err["message"].lower(), err
    assert set(err) == {"message", "type", "param", "code"}


def _greedy_text(http: httpx.Client, temperature: float = 0, **fields) -> str:
    resp = http.post(C, json=_completion(max_tokens=6, temperature=temperature, ignore_eos=True,
                                         **fields))
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 6
    return resp.json()["choices"][0]["text"]


def test_hundred_bad_requests_get_clear_4xx_and_server_stays_healthy(server):
    field_cases, raw_cases = _field_cases(), _raw_cases()
    assert len(field_cases) + len(raw_cases) >= 100
    with server.client() as http:
        before = _greedy_text(http)
        for path, body, status, text in field_cases:
            _check_error(http.post(path, json=body), status, text)
        for method, path, raw, headers, status, text in raw_cases:
            _check_error(http.request(method, path, content=raw, headers=headers), status, text)
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        assert _greedy_text(http) == before  # a normal request is still answered correctly
    values = wait_until_idle(server)
    assert values["hifc_gpu_kv_blocks_free"] == values["hifc_gpu_kv_blocks_total"]


def test_temperature_below_epsilon_is_greedy(server):
    with server.client() as http:
        assert _greedy_text(http, temperature=1e-40, seed=3) == _greedy_text(http)


_UNPARSEABLE = {  # requests h11 cannot parse: uvicorn answers them before the app
    "malformed request line": b"GARBAGE\r\n\r\n",
    "bad Content-Length": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc"
                          b"\r\n\r\n{}",
    "two Content-Lengths": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2"
                           b"\r\nContent-Length: 3\r\n\r\n{}",
    "broken chunked body": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    # 20 KB of a header and no end yet: more than h11 buffers (16 KiB) for an unfinished head
    "headers over 16 KiB": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20000,
    "no Host header": b"GET /v1/models HTTP/1.1\r\n\r\n",
    "TLS handshake": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),
}


def _raw_exchange(base_url: str, request: bytes) -> bytes:
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        response = b""
        while chunk := sock.recv(65536):  # the server closes the connection after a 400
            response += chunk
    return response


@pytest.mark.parametrize("request_bytes", list(_UNPARSEABLE.values()), ids=list(_UNPARSEABLE))
def test_unparseable_http_gets_a_json_400_and_the_connection_closes(server, request_bytes):
    head, _, body = _raw_exchange(server.base_url, request_bytes).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"].startswith("invalid HTTP request")
    with server.client() as http:
        assert _greedy_text(http)  # the server goes on serving


def test_context_overflow_names_limit_and_request(server):
    with server.client() as http:
        resp = http.post(C, json=_completion(prompt=[5] * 200, max_tokens=100))
    _check_error(resp, 400, f"maximum context length is {MAX_MODEL_LEN} tokens")
    assert "300" in resp.json()["error"]["message"]  # 200 prompt + 100 to generate


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "test-key"},
                                     {"Authorization": "Basic test-key"},
                                     {"Authorization": "Bearer test-key-and-more"}])
def test_missing_or_wrong_api_key_is_401(server, headers):
    for method, path in (("GET", "/v1/models"), ("POST", C), ("POST", CHAT)):
        resp = httpx.request(method, f"{server.base_url}{path}", headers=headers,
                             json=_completion())
        _check_error(resp, 401, "API key")
        assert resp.json()["error"]["code"] == "invalid_api_key"


def test_health_and_metrics_need_no_key(server):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/metrics").status_code == 200


def test_streaming_request_with_bad_input_fails_before_the_stream(server):
    with server.client() as http:
        resp = http.post(C, json=_completion(prompt=[10 ** 6], stream=True))
    _check_error(resp, 400, "outside the vocabulary")
    assert resp.headers["content-type"].startswith("application/json")
