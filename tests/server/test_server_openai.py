"""The official ``openai`` client against a real server: completions and chat, sync, async and
streaming, with usage."""
from __future__ import annotations

import asyncio

import openai
import pytest

from tests.server.helpers import MODEL_NAME


@pytest.fixture()
def client(server):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key,
                       max_retries=0, timeout=30) as c:
        yield c


def _async_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key,
                              max_retries=0, timeout=30)


def test_models_lists_the_served_name(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_completion_sync(client):
    r = client.completions.create(model=MODEL_NAME, prompt="The capital of France is",
                                  max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert r.object == "text_completion" and r.model == MODEL_NAME
    assert choice.finish_reason == "length" and isinstance(choice.text, str)
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6 and r.usage.prompt_tokens > 0


def test_greedy_is_deterministic_and_token_prompts_match_text(client, server):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(server.model_dir)).encode("Hello, world!")
    texts = [client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True}).choices[0].text
             for p in ("Hello, world!", ids, [ids])]
    assert texts[0] == texts[1] == texts[2]


def test_seeded_sampling_repeats(client):
    kwargs = dict(model=MODEL_NAME, prompt="Flash memory", max_tokens=8, temperature=1.0,
                  seed=1234, extra_body={"ignore_eos": True, "top_k": 50})
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first


def test_stop_string_cuts_text(client):
    base = client.completions.create(model=MODEL_NAME, prompt="The quick brown fox",
                                     max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[3:5] if len(base) >= 5 else None
    if not stop or not stop.strip():
        pytest.skip("greedy text too short to pick a stop string from")
    r = client.completions.create(model=MODEL_NAME, prompt="The quick brown fox", max_tokens=12,
                                  temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]
    # streamed with the same stop: same text, never a piece of the stop string
    chunks = client.completions.create(model=MODEL_NAME, prompt="The quick brown fox",
                                       max_tokens=12, temperature=0, stop=stop, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks) == base[:base.index(stop)]


def test_chat_sync(client):
    r = client.chat.completions.create(
        model=MODEL_NAME, max_completion_tokens=5, temperature=0,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is flash memory?"}])
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage.completion_tokens <= 5 and r.usage.prompt_tokens > 10


def test_streaming_completion_matches_non_streaming(client):
    kwargs = dict(model=MODEL_NAME, prompt="Paged attention reads", max_tokens=10,
                  temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_streaming_chat(client):
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi!"}], max_tokens=6,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 6
    full = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi!"}], max_tokens=6,
        temperature=0, extra_body={"ignore_eos": True}).choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full


def test_async_client_concurrent_and_streaming(server):
    async def main():
        async with _async_client(server) as ac:
            completions = await asyncio.gather(*[
                ac.completions.create(model=MODEL_NAME, prompt=f"Request {i}", max_tokens=4,
                                      temperature=0, extra_body={"ignore_eos": True})
                for i in range(4)])
            chat = await ac.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "Hello"}],
                max_tokens=4, stream=True)
            pieces = [c.choices[0].delta.content async for c in chat if c.choices]
            return completions, pieces

    completions, pieces = asyncio.run(main())
    assert all(c.usage.completion_tokens == 4 for c in completions)
    assert len(pieces) >= 2


def test_client_errors_are_typed(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=1000)
    with pytest.raises(openai.BadRequestError, match="n: Input should be greater than"):
        client.chat.completions.create(model=MODEL_NAME, n=0, max_tokens=2,
                                       messages=[{"role": "user", "content": "x"}])
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
