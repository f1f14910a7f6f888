"""SmolLM2-135M (fp32) against transformers: logprobs of generated and prompt tokens, penalties
and min-p against a reference of the same formulas on transformers' logits, and JSON-schema
outputs through the official openai client (streaming and not)."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from hifc import SamplingParams
from hifc.layers.sampling_ops import seeded_uniform

PROMPT = "The capital of France is"


def _hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every position of ``ids`` ([len(ids), V])."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_logprobs_match_transformers(smollm2):
    llm, hf, _ = smollm2
    out = llm.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                                              logprobs=5, prompt_logprobs=5),
                       use_tqdm=False)[0]
    ids, gen = out.prompt_token_ids, out.token_ids
    ref = _hf_logprobs(hf, ids + gen)  # row j predicts token j + 1
    for j, position in enumerate(out.prompt_logprobs[1:], start=1):
        target = ids[j]
        assert position[target].logprob == pytest.approx(ref[j - 1, target].item(), abs=1e-3)
        assert position[target].rank == 1 + int((ref[j - 1] > ref[j - 1, target]).sum())
    top_ref = [ref[len(ids) - 1 + i].topk(5) for i in range(len(gen))]
    for i, (token, position) in enumerate(zip(gen, out.outputs[0].logprobs)):
        row = ref[len(ids) - 1 + i]
        assert position[token].logprob == pytest.approx(row[token].item(), abs=1e-3)
        top = sorted((lp.rank, t, lp.logprob) for t, lp in position.items())[:5]
        assert [t for _, t, _ in top] == top_ref[i].indices.tolist()
        for (_, _, logprob), expected in zip(top, top_ref[i].values.tolist()):
            assert logprob == pytest.approx(expected, abs=1e-3)
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(ref[len(ids) - 1 + i, t].item() for i, t in enumerate(gen)), abs=5e-3)


def _reference_logits(row: torch.Tensor, prompt: list[int], output: list[int],
                      p: SamplingParams) -> torch.Tensor:
    """vLLM's penalties on one row of logits, token by token."""
    row = row.clone()
    counts = Counter(output)
    for t in set(prompt) | set(counts):
        row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t, c in counts.items():
        row[t] -= p.frequency_penalty * c + p.presence_penalty
    return row


def _reference_run(hf, prompt: list[int], p: SamplingParams, steps: int) -> list[int]:
    """Generate with transformers' logits, the reference penalties, temperature and min-p, and
    (sampling) the engine's seeded uniform number of each step, drawn by inverse CDF."""
    output: list[int] = []
    for step in range(steps):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + output])).logits[0, -1].float()
        logits = _reference_logits(logits, prompt, output, p)
        if p.temperature == 0:
            output.append(int(logits.argmax()))
            continue
        probs = torch.softmax(logits / p.temperature, -1)
        probs = torch.where(probs < p.min_p * probs.max(), 0.0, probs)
        u = float(seeded_uniform([p.seed], [step])[0])
        cdf = probs.cumsum(0)
        output.append(int((cdf <= u * cdf[-1]).sum()))  # the first token past u of the mass
    return output


@pytest.mark.parametrize("params", [
    dict(temperature=0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.8),
    dict(temperature=0.8, seed=42, min_p=0.1, repetition_penalty=1.2, presence_penalty=1.0,
         frequency_penalty=0.3),
])
def test_penalties_and_min_p_match_a_reference(smollm2, params):
    llm, hf, _ = smollm2
    p = SamplingParams(max_tokens=10, ignore_eos=True, **params)
    out = llm.generate(PROMPT, p, use_tqdm=False)[0]
    assert out.token_ids == _reference_run(hf, out.prompt_token_ids, p, 10)
    plain = llm.generate(PROMPT, SamplingParams(max_tokens=10, ignore_eos=True, temperature=0),
                         use_tqdm=False)[0]
    assert plain.token_ids != out.token_ids  # the penalties changed something


SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 20},
                         "population": {"type": "integer", "minimum": 0},
                         "capital": {"type": "boolean"}},
          "required": ["city", "population", "capital"], "additionalProperties": False}


def _validates(text: str) -> dict:
    """The parsed object, checked against SCHEMA by hand."""
    obj = json.loads(text)
    assert set(obj) == {"city", "population", "capital"}
    assert isinstance(obj["city"], str) and len(obj["city"]) <= 20
    assert isinstance(obj["population"], int) and not isinstance(obj["population"], bool)
    assert obj["population"] >= 0 and isinstance(obj["capital"], bool)
    return obj


@pytest.fixture(scope="module")
def smollm2_client(smollm2):
    """The official openai client talking to an app that serves the session's SmolLM2 engine
    (in process, through fastapi's TestClient)."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("xgrammar")
    from tests.server.helpers import app_client

    with app_client(smollm2[0].engine, name="smol") as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http,
                            max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_validates(smollm2_client, stream):
    messages = [{"role": "user", "content": "Describe Paris as JSON: city, population and "
                                            "whether it is a capital."}]
    kwargs = dict(model="smol", messages=messages, max_tokens=80, temperature=0,
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "city", "schema": SCHEMA}})
    if stream:
        chunks = list(smollm2_client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        choice = smollm2_client.chat.completions.create(**kwargs).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    assert finish == "stop"
    assert _validates(text)["city"]


def test_guided_json_on_completions_and_json_object(smollm2_client):
    r = smollm2_client.completions.create(
        model="smol", prompt="Paris, as JSON:", max_tokens=80, temperature=0,
        extra_body={"guided_json": SCHEMA})
    _validates(r.choices[0].text)
    r = smollm2_client.chat.completions.create(
        model="smol", max_tokens=60, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with a JSON object {"answer": ...}: what '
                                              'is the capital of France?'}])
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)
