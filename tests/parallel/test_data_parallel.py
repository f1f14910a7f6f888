"""Data parallelism on the CPU: two replica processes give every request the output one engine
gives it (greedy and seeded sampling, with flash swapping forced through the shared device's
arbiter, on a random preset and on SmolLM2), spread the requests, abort cleanly and leave no
process behind. (Arbiter off: tests/bench/test_bench_parallel.py; closing through the server:
tests/server/test_server_data_parallel.py.)"""
from __future__ import annotations

import multiprocessing
import random
import threading

import pytest

from hifc import LLM, SamplingParams
from hifc.sampling_params import StructuredOutputsParams
from hifc.structured.grammar import GrammarCompiler
from tests.engine.test_swap import assert_all_released

pytestmark = pytest.mark.slow  # each engine here starts two processes (~10 s on the CPU VM)

MODEL = "random:tiny-llama"
BLOCK = 16
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def prompts(n: int = 10, seed: int = 0) -> list[list[int]]:
    """Prompts that fill most of one block: every sequence soon needs a second one."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(BLOCK - 4 - i % 5)] for i in range(n)]


def mixed_params(n: int) -> list[SamplingParams]:
    """Greedy for even requests, seeded sampling for odd ones."""
    return [GREEDY if i % 2 == 0 else
            SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, seed=100 + i,
                           ignore_eos=True) for i in range(n)]


def token_ids(llm, prompt_list, params) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompt_list, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference():
    with LLM(MODEL, device="cpu", block_size=BLOCK, num_gpu_blocks=64) as one:
        return token_ids(one, prompts(), mixed_params(10))


@pytest.fixture(scope="module")
def dp2(tmp_path_factory):
    """7 blocks per replica for 5 sequences of 2 blocks: every replica preempts and swaps to
    its own flash file; both files in one directory, so on one device, through its arbiter."""
    path = tmp_path_factory.mktemp("dp2") / "kv-{replica}.hifc"
    llm = LLM(MODEL, device="cpu", block_size=BLOCK, num_gpu_blocks=7, kv_offload="flash",
              flash_path=str(path), flash_size_gib=0.01, data_parallel_size=2)
    processes = list(llm.engine._processes)
    yield llm
    llm.close()
    assert all(not p.is_alive() and p.exitcode == 0 for p in processes)


def completions(llm, prompt_list, params) -> list:
    """Every completion's tokens, stop reason and logprobs (as plain pairs)."""
    return [[(c.token_ids, c.finish_reason, c.stop_reason, round(c.cumulative_logprob or 0, 3),
              [{t: round(lp.logprob, 5) for t, lp in pos.items()} for pos in c.logprobs or []])
             for c in out.outputs]
            for out in llm.generate(prompt_list, params, use_tqdm=False)]


def settled(llm) -> dict:
    """The stats once the engine has nothing unfinished: every replica has freed its blocks
    (a replica reports the state aborts left it in before the front end has nothing left)."""
    assert_all_released(llm)
    stats = llm.stats()
    assert stats["running"] == stats["waiting"] == stats["swapped"] == 0, stats
    return stats


def test_n_completions_logprobs_and_stop_reasons_equal_one_engine(dp2):
    params = [SamplingParams(n=3, max_tokens=8, temperature=0.9, seed=7, logprobs=2,
                             ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[40, 41, 42],
                             logprobs=1, ignore_eos=True)]
    with LLM(MODEL, device="cpu", block_size=BLOCK, num_gpu_blocks=64) as one:
        expected = completions(one, prompts(2), params)
    got = completions(dp2, prompts(2), params)
    assert got == expected
    assert len(got[0]) == 3 and all(len(c[4]) == len(c[0]) for c in got[0])


def test_outputs_equal_one_engine_with_flash_swapping(dp2, reference):
    assert token_ids(dp2, prompts(), mixed_params(10)) == reference
    stats = settled(dp2)
    assert stats["data_parallel_size"] == 2 and len(stats["replicas"]) == 2
    per_replica = [r["generation_tokens"] for r in stats["replicas"]]
    assert stats["generation_tokens"] == sum(per_replica)
    for replica in stats["replicas"]:  # each served requests, preempted and swapped
        assert replica["device"] == "cpu" and replica["generation_tokens"] > 0
        assert replica["preemptions"] > 0 and replica["swap_out_blocks"] > 0
        assert replica["swap_in_blocks"] == replica["swap_out_blocks"]
        assert replica["recomputed_sequences"] == 0
        assert replica["arbiter_swap_out_bytes"] >= replica["tier_bytes_written"] > 0
    assert [r["flash_path"].rsplit("/", 1)[1] for r in stats["replicas"]] == [
        "kv-0.hifc", "kv-1.hifc"]
    (device,) = stats["flash_devices"]
    assert device["replica_ids"] == [0, 1] and device["inflight_bytes"] == 0
    assert device["swap_out_bytes"] > 0 and device["swap_in_bytes"] > 0


def test_bad_input_is_refused_before_anything_is_queued(dp2):
    engine = dp2.engine
    with pytest.raises(ValueError, match="outside the vocabulary"):
        dp2.generate([[5, 6], [10 ** 9]], GREEDY, use_tqdm=False)
    assert not engine.has_unfinished_requests()
    engine.add_request("same", [5, 6, 7], GREEDY)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("same", [5, 6, 7], GREEDY)
    engine.abort_request("same")
    while engine.has_unfinished_requests():  # until its replica says the abort left it idle
        assert engine.step() == []
    settled(dp2)


def test_abort_frees_every_replicas_blocks(dp2):
    engine = dp2.engine
    long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(6, seed=3)):
        engine.add_request(f"abort-{i}", p, long)
    seen: dict[str, int] = {}
    while len(seen) < 6:
        for out in engine.step():
            seen[out.request_id] = len(out.token_ids)
            assert not out.finished
    engine.abort_request([f"abort-{i}" for i in range(0, 6, 2)])
    finished = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id in {f"abort-{i}" for i in range(1, 6, 2)}
            finished.update([out.request_id] if out.finished else [])
    assert finished == {"abort-1", "abort-3", "abort-5"}
    settled(dp2)


def test_a_replica_finishing_untracked_work_holds_up_no_step(dp2):
    """While a replica only finishes work the front end no longer tracks (an aborted request's
    swap I/O, prefix writes), ``step()`` returns after a short wait: the server's engine thread
    takes new requests meanwhile, and steps again until the replica reports itself idle."""
    engine = dp2.engine
    engine._idle[0] = False  # what such a replica's last message says
    try:
        assert engine.has_unfinished_requests()
        returned: list = []
        thread = threading.Thread(target=lambda: returned.append(engine.step()), daemon=True)
        thread.start()
        thread.join(10)
        assert returned == [[]]
        assert engine.has_unfinished_requests()
    finally:
        engine._idle[0] = True
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("model, options, error", [
    ("random:no-such-model", {}, "unknown random preset"),
    ("random:tiny-llama", {"hf_overrides": {"num_layers": 1}},
     "unknown key.*'num_layers'.*num_hidden_layers")], ids=["model", "hf_overrides"])
def test_a_replica_that_cannot_start_fails_the_engine_with_its_error(model, options, error):
    before = set(multiprocessing.active_children())  # the module's dp2 replicas
    with pytest.raises(ValueError, match=error):
        LLM(model, device="cpu", data_parallel_size=2, **options)
    assert set(multiprocessing.active_children()) <= before


def test_smollm2_text_chat_and_stop_strings_equal_one_engine(smollm2, tmp_path, monkeypatch):
    """... and a structured request: its grammar is compiled in its replica alone (the front
    end parses it)."""
    one = smollm2[0]
    texts = ["The capital of France is", "def fibonacci(n):", "Flash memory is",
             "Once upon a time", "The GPU", "Hello, my name is"]
    free = one.generate(texts[1], SamplingParams(max_tokens=20, temperature=0),
                        use_tqdm=False)[0]
    stop = free.text.strip()[3:7]
    params = [SamplingParams(max_tokens=20, temperature=0, stop=[stop] if i == 1 else [])
              for i in range(len(texts))]
    texts.append("Is flash memory fast? Answer:")
    params.append(SamplingParams(max_tokens=8, temperature=0, structured_outputs=(
        StructuredOutputsParams(choice=["yes", "no", "it depends"]))))
    chat = [{"role": "user", "content": "Say hello."}]
    chat_params = SamplingParams(max_tokens=12, temperature=0)
    expected = one.generate(texts, params, use_tqdm=False) + one.chat(chat, chat_params,
                                                                      use_tqdm=False)

    def not_here(*args, **kwargs):
        raise AssertionError("the front end compiled a grammar")

    monkeypatch.setattr(GrammarCompiler, "__init__", not_here)  # in this process only
    # 5 blocks of 16 tokens per replica; each replica gets 3 or 4 of the texts, most of which
    # grow to 2 blocks each: swaps to flash
    with LLM("smollm2-135m", device="cpu", block_size=16, max_model_len=80, num_gpu_blocks=5,
             kv_offload="flash", flash_path=f"{tmp_path}/a.kv,{tmp_path}/b.kv",
             flash_size_gib=0.05, data_parallel_size=2) as two:
        got = two.generate(texts, params, use_tqdm=False) + two.chat(chat, chat_params,
                                                                      use_tqdm=False)
        stats = two.stats()
        with pytest.raises(ValueError, match="invalid regex"):
            two.generate(texts[0], SamplingParams(structured_outputs=StructuredOutputsParams(
                regex="(")), use_tqdm=False)
    assert got[1].finish_reason == "stop" and stop not in got[1].text
    assert got[-2].text in ("yes", "no", "it depends")
    assert [(o.token_ids, o.text, o.finish_reason) for o in got] == \
        [(o.token_ids, o.text, o.finish_reason) for o in expected]
    assert stats["swap_out_blocks"] > 0 and stats["recomputed_sequences"] == 0
