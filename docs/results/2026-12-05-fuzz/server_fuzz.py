"""Random request bodies against the OpenAI-compatible app (in process, through its
TestClient): each of 1-4 fields of a valid completion or chat request gets an odd value (wrong
types, out-of-range numbers, NaN, huge strings, broken grammars and schemas, odd messages).
Prints any answer that is not 200, 400, 404 or 422, any 4xx outside the OpenAI error format,
any stream without its end, then the health check and the free KV blocks.

Usage (repo root): PYTHONPATH=$PWD python docs/results/2026-12-05-fuzz/server_fuzz.py FIRST END
"""
import json
import pathlib
import random
import sys
import tempfile

import torch

from hifc import LLMEngine
from tests.fixtures import make_tiny_hf_model
from tests.server.helpers import app_client

torch.set_num_threads(1)

model = str(make_tiny_hf_model(pathlib.Path(tempfile.mkdtemp()) / "tiny", "llama"))
engine = LLMEngine.from_options(model, device="cpu", dtype="float32", block_size=16,
                                num_gpu_blocks=24, max_model_len=128, max_num_seqs=8)
WEIRD = [
    None, True, False, 0, 1, -1, 2, 5, 3.5, -0.0, 1e30, -1e30, float("nan"), 2**63, -2**63,
    2**64, "", "x", "1", "null", "\u0000", "\ud7ff", [], [1], [1, 2], [[1, 2]], [[]], ["a"],
    ["a", ""], [None], {}, {"a": 1}, {"type": "json_object"},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
    {"type": "json_schema"}, {"regex": "[a-"}, {"choice": []}, {"json": "{"},
    {"grammar": "root ::= "}, {"0": 100}, {"99999": 1.0}, {"-1": 1.0}, {"1": float("inf")},
    "a" * 5000, list(range(300)), [10**9]]
FIELDS_C = [
    "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed", "stop",
    "stop_token_ids", "ignore_eos", "min_tokens", "skip_special_tokens",
    "include_stop_str_in_output", "stream", "stream_options", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids", "bad_words",
    "prompt_logprobs", "user", "response_format", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar", "structured_outputs", "return_token_ids", "echo",
    "logprobs", "best_of", "suffix", "model", "bogus"]
FIELDS_CHAT = [f for f in FIELDS_C if f not in ("prompt", "echo", "logprobs", "best_of",
                                                "suffix")] + [
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
    "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs"]
MSG_WEIRD = [
    [{"role": "user", "content": None}], [{"role": "assistant", "content": "x"}],
    [{"role": "tool", "content": "x"}],
    [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], [{"role": "user"}],
    [{"content": "x"}], [{"role": "user", "content": "hi", "extra": 1}],
    [{"role": "system", "content": "s"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "pre"}]]


def body(rng, chat):
    b = ({"model": "m", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 4}
         if chat else {"model": "m", "prompt": "Hello", "max_tokens": 4})
    for _ in range(rng.randint(1, 4)):
        field = rng.choice(FIELDS_CHAT if chat else FIELDS_C)
        odd = MSG_WEIRD if field == "messages" and rng.random() < 0.7 else WEIRD
        b[field] = rng.choice(odd)
    return b


def main(lo, hi):
    rng = random.Random(lo)
    unexpected = 0
    with app_client(engine, "m") as client:
        for _ in range(lo, hi):
            chat = rng.random() < 0.5
            b = body(rng, chat)
            path = "/v1/chat/completions" if chat else "/v1/completions"
            data = json.dumps(b, allow_nan=True)
            r = client.post(path, content=data, headers={"content-type": "application/json"})
            if r.status_code not in (200, 400, 404, 422):
                unexpected += 1
                print("UNEXPECTED", r.status_code, path, data[:400], "->", r.text[:400])
            elif r.status_code == 200 and b.get("stream") is True and (
                    "data: [DONE]" not in r.text or '"error"' in r.text):
                unexpected += 1
                print("STREAM", data[:300], r.text[-500:])
            elif r.status_code != 200 and not r.json().get("error", {}).get("message"):
                unexpected += 1
                print("ERROR FORMAT", r.status_code, r.text[:300])
        print("health", client.get("/health").status_code)
        stats = engine.stats()
        print("KV blocks free", stats["gpu_blocks_free"], "of", stats["gpu_blocks_total"])
    print("requests", hi - lo, "unexpected answers", unexpected)


main(int(sys.argv[1]), int(sys.argv[2]))
