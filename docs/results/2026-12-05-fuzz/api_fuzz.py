"""Random valid completion and chat requests (text with multi-byte characters or token ids,
greedy or seeded, n, stop strings, logprobs, echo, min_tokens, return_token_ids) through the
app in process: each is sent plain and streamed (with usage), and the streamed chunks joined
must equal the plain response (text, finish reason, logprob tokens, token ids; usage but its
cached tokens), the usage must count the returned token ids, and a completion's choices must
equal LLM.generate's for the same parameters. Prints each request that differs.

Usage (repo root): PYTHONPATH=$PWD python docs/results/2026-12-05-fuzz/api_fuzz.py FIRST END
"""
import json
import pathlib
import random
import sys
import tempfile

import torch

from hifc import LLM, LLMEngine, SamplingParams
from tests.fixtures import make_tiny_hf_model
from tests.server.helpers import app_client

torch.set_num_threads(1)

model = str(make_tiny_hf_model(pathlib.Path(tempfile.mkdtemp()) / "tiny", "llama"))
engine = LLMEngine.from_options(model, device="cpu", dtype="float32", block_size=16,
                                num_gpu_blocks=40, max_model_len=192, max_num_seqs=8)
ref = LLM(model, device="cpu", dtype="float32", block_size=16, num_gpu_blocks=64,
          max_model_len=192, enable_prefix_caching=False)
WORDS = ["the", "fox", "a", "dog", "and", "of", "in", "to", " ", "!", "é", "日本"]


def rand_text(rng, n):
    return "".join(rng.choice(WORDS) + (" " if rng.random() < 0.5 else "") for _ in range(n))


def request(rng):
    chat = rng.random() < 0.5
    b = {"model": "m", "max_tokens": rng.randint(1, 30), "seed": rng.randrange(1000)}
    if chat:
        b["messages"] = [{"role": "user", "content": rand_text(rng, rng.randint(1, 20))}]
    elif rng.random() < 0.7:
        b["prompt"] = rand_text(rng, rng.randint(1, 20))
    else:
        b["prompt"] = [rng.randrange(3, 380) for _ in range(rng.randint(1, 30))]
    if rng.random() < 0.5:
        b["temperature"] = 0
    else:
        b.update(temperature=rng.choice([0.7, 1.0]), top_p=rng.choice([1.0, 0.9]))
    if rng.random() < 0.4:
        b["n"] = rng.choice([2, 3])
    if rng.random() < 0.3:
        b["stop"] = rng.sample(WORDS[:8], 2)
    if rng.random() < 0.2:
        b["include_stop_str_in_output"] = True
    if rng.random() < 0.5:
        b["ignore_eos"] = True
    if rng.random() < 0.3:
        if chat:
            b.update(logprobs=True, top_logprobs=rng.choice([0, 2]))
        else:
            b["logprobs"] = rng.choice([0, 2])
    if not chat and rng.random() < 0.15:
        b["echo"] = True
    if rng.random() < 0.2:
        b["min_tokens"] = rng.randint(0, 3)
    if rng.random() < 0.2:
        b["return_token_ids"] = True
    return chat, b


def choice_state(choices, index):
    return choices.setdefault(index, {"text": "", "finish_reason": None, "lp_tokens": [],
                                      "token_ids": []})


def join_stream(text, chat):
    choices, usage = {}, None
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        data = json.loads(line[6:])
        usage = data.get("usage") or usage
        for c in data["choices"]:
            state = choice_state(choices, c["index"])
            lp = c.get("logprobs") or {}
            if chat:
                state["text"] += (c.get("delta") or {}).get("content") or ""
                state["lp_tokens"] += [x["token"] for x in lp.get("content") or []]
            else:
                state["text"] += c.get("text", "")
                state["lp_tokens"] += lp.get("tokens") or []
            state["token_ids"] += c.get("token_ids") or []
            state["finish_reason"] = c.get("finish_reason") or state["finish_reason"]
    return choices, usage


def plain(data, chat):
    choices = {}
    for c in data["choices"]:
        state = choice_state(choices, c["index"])
        lp = c.get("logprobs") or {}
        if chat:
            state["text"] = c["message"]["content"] or ""
            state["lp_tokens"] = [x["token"] for x in lp.get("content") or []]
        else:
            state["text"] = c["text"]
            state["lp_tokens"] = lp.get("tokens") or []
        state["token_ids"] = c.get("token_ids") or []
        state["finish_reason"] = c["finish_reason"]
    return choices, data["usage"]


def direct(b):
    params = SamplingParams(
        max_tokens=b["max_tokens"], seed=b["seed"], temperature=b["temperature"],
        top_p=b.get("top_p", 1.0), n=b.get("n", 1), stop=tuple(b.get("stop", ())),
        include_stop_str_in_output=b.get("include_stop_str_in_output", False),
        ignore_eos=b.get("ignore_eos", False), min_tokens=b.get("min_tokens", 0))
    out = ref.generate([b["prompt"]], params, use_tqdm=False)[0]
    return {c.index: (c.text, c.finish_reason) for c in out.outputs}


def without_cached(usage):
    return {k: v for k, v in (usage or {}).items() if k != "prompt_tokens_details"}


def main(lo, hi):
    differing = 0
    with app_client(engine, "m") as client:
        for seed in range(lo, hi):
            chat, b = request(random.Random(seed))
            path = "/v1/chat/completions" if chat else "/v1/completions"
            answer = client.post(path, json=b)
            if answer.status_code != 200:
                print("seed", seed, answer.status_code, answer.text[:200])
                continue
            full, usage = plain(answer.json(), chat)
            stream = client.post(path, json=dict(b, stream=True,
                                                 stream_options={"include_usage": True}))
            streamed, stream_usage = join_stream(stream.text, chat)
            problems = []
            if streamed != full:
                problems.append(("streamed", streamed, full))
            if without_cached(stream_usage) != without_cached(usage):
                problems.append(("usage", stream_usage, usage))
            if b.get("return_token_ids") and (
                    sum(len(c["token_ids"]) for c in full.values()) != usage["completion_tokens"]):
                problems.append(("completion_tokens", usage))
            if not chat and not b.get("echo"):
                served = {i: (c["text"], c["finish_reason"]) for i, c in full.items()}
                if direct(b) != served:
                    problems.append(("LLM.generate", direct(b), served))
            if problems:
                differing += 1
                print("seed", seed, json.dumps(b)[:300])
                for problem in problems:
                    print("   ", str(problem)[:900])
    print("requests", hi - lo, "differing", differing)


main(int(sys.argv[1]), int(sys.argv[2]))
