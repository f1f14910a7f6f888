"""Random engine configurations under random workloads, against each request run alone.

Each case draws a configuration (block size, a tight KV pool, chunked prefill budgets, prefix
caching, asynchronous scheduling, no tier / DRAM / flash with the prefix store, the preemption
mode, injected flash faults, an fp8 KV cache) and a workload (prompts over shared prefixes,
token ids or text; greedy or seeded sampling with n, logprobs, prompt logprobs, stops, bad
words, penalties, logit bias, allowed tokens, structured outputs, all three output kinds),
adds the requests between steps and aborts some. Every request that was not aborted must end
and give what it gives alone in a roomy engine, nothing may stay held, and a second engine on
the same flash file must give the same outputs from its prefix store.

Another batch around a sequence changes its logits' last bits (1e-6), so two candidates that
close (a greedy or top-k near-tie of the random model's flat distribution, or a seeded draw
that close to the cumulative probability between two tokens) may swap: in 2,000 other seeds
that happened three times, and in these cases never on this machine.
With an fp8 cache only the ending and the release are checked: that rounding now and then
moves one fp8 element to its neighbour, 12.5% away, which changes logprobs by up to 2e-2 and
may change a sampled token."""
from __future__ import annotations

import random

import pytest

from hifc import LLM, LLMEngine, SamplingParams
from hifc.sampling_params import RequestOutputKind, StructuredOutputsParams
from tests.engine.test_swap import assert_all_released
from tests.fixtures import make_tiny_hf_model
from tests.parallel.test_data_parallel import settled

VOCAB = 380  # the tiny tokenizer has 384 ids
WORDS = ["the", "fox", "a", "dog", "and", "of", "in", "to"]
CODE = StructuredOutputsParams(regex=r"[a-c]{2,6}-[0-9]{2}")
MAX_MODEL_LEN = 192  # the smallest pool's size; max_tokens None fills it


def random_params(rng: random.Random) -> SamplingParams:
    kw = dict(max_tokens=rng.randint(1, 40) if rng.random() < 0.9 else None,
              ignore_eos=rng.random() < 0.7,
              n=rng.choice([1, 1, 1, 2, 3]), output_kind=rng.choice(list(RequestOutputKind)))
    if rng.random() < 0.5:
        kw["temperature"] = 0.0
    else:  # seeded: the same tokens in any batch
        kw.update(temperature=rng.choice([0.5, 1.0, 1.3]), seed=rng.randrange(1 << 30),
                  top_p=rng.choice([1.0, 0.9]), top_k=rng.choice([0, 5, 50]),
                  min_p=rng.choice([0.0, 0.0, 0.05]))
    if rng.random() < 0.3:
        kw["logprobs"] = rng.choice([0, 1, 3])
    if rng.random() < 0.2:
        kw["prompt_logprobs"] = rng.choice([0, 2])
    if rng.random() < 0.2:
        kw["stop_token_ids"] = tuple(rng.randrange(3, VOCAB) for _ in range(3))
    if rng.random() < 0.2:
        kw["stop"] = tuple(rng.sample(WORDS, 2))
        kw["include_stop_str_in_output"] = rng.random() < 0.5
    if rng.random() < 0.15:
        kw["bad_words"] = tuple(rng.sample(WORDS, 2))
    if rng.random() < 0.2:
        kw.update(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2)
    if rng.random() < 0.1:
        kw["logit_bias"] = {rng.randrange(3, VOCAB): 5.0}
    if rng.random() < 0.05:
        kw["allowed_token_ids"] = tuple(rng.sample(range(3, VOCAB), 20))
    elif rng.random() < 0.12:
        kw["structured_outputs"] = CODE
    if rng.random() < 0.15:
        kw["min_tokens"] = rng.randint(0, min(5, kw["max_tokens"] or 5))
    return SamplingParams(**kw)


def random_workload(rng: random.Random) -> list[tuple[str, list[int] | str, SamplingParams]]:
    prefixes = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(10, 80))] for _ in range(3)]
    work = []
    for i in range(rng.randint(6, 14)):
        tail = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 60))]
        prompt = rng.choice(prefixes) + tail if rng.random() < 0.6 else tail
        if rng.random() < 0.25:
            prompt = " ".join(rng.choice(WORDS) for _ in range(len(prompt) // 2 + 1))
        work.append((f"r{i}", prompt, random_params(rng)))
    return work


def random_config(rng: random.Random, tmp_path) -> dict:
    block_size = rng.choice([16, 32])
    cfg = dict(device="cpu", dtype="float32", block_size=block_size,
               max_model_len=MAX_MODEL_LEN, max_num_seqs=rng.choice([4, 8, 8]),
               num_gpu_blocks=rng.randint(12, 20) * 16 // block_size,
               enable_prefix_caching=rng.random() < 0.8, async_scheduling=rng.random() < 0.5)
    if rng.random() < 0.7:
        cfg["max_num_batched_tokens"] = max(cfg["max_num_seqs"], rng.choice([16, 32, 64, 128]))
        if rng.random() < 0.3:
            cfg["long_prefill_token_threshold"] = rng.choice([8, 16])
    elif rng.random() < 0.5:
        cfg.update(enable_chunked_prefill=False, max_num_batched_tokens=512)
    tier = rng.choice(["none", "dram", "flash", "flash"])
    if tier == "dram":
        cfg.update(kv_offload="dram", num_tier_blocks=rng.randint(4, 40))
    elif tier == "flash":
        cfg.update(kv_offload="flash", flash_path=str(tmp_path / "kv.hifc"),
                   num_tier_blocks=rng.randint(4, 60),
                   prefix_store=rng.choice(["off", "evicted", "all"]),
                   prefix_store_read=rng.choice(["auto", "always"]),
                   flash_policy=rng.choice(["append", "left-append"]),
                   tier_fault_injection=rng.random() < 0.4)
    if tier != "none":
        cfg["preemption"] = rng.choice(["swap", "auto", "recompute"])
    if rng.random() < 0.2:
        cfg["kv_cache_dtype"] = "fp8"
    return cfg


def arm_faults(engine: LLMEngine, rng: random.Random) -> None:
    op = rng.choice(["write", "read"])
    effect = rng.choice(["eio", "enospc"] if op == "write" else ["eio", "short", "bitflip"])
    engine.tier.faults.arm(op, effect, times=rng.randint(1, 3), skip=rng.randint(0, 2))


def gather(outputs: dict, output, params: SamplingParams) -> None:
    """A request's outputs read as one (``DELTA`` outputs extend each other)."""
    if params.output_kind is RequestOutputKind.DELTA and output.request_id in outputs:
        outputs[output.request_id].extend(output)
    else:
        outputs[output.request_id] = output


def drive(engine: LLMEngine, work, rng: random.Random | None = None) -> tuple[dict, set]:
    """Run ``work`` to its end; with ``rng``, add requests between random steps and abort
    some. Returns each request's gathered output and the aborted ids."""
    params = {rid: p for rid, _, p in work}
    pending, added, outputs, aborted = list(work), [], {}, set()
    while pending or engine.has_unfinished_requests():
        while pending and (rng is None or rng.random() < 0.5):
            engine.add_request(*pending[0])
            added.append(pending.pop(0)[0])
        if rng is not None and rng.random() < 0.02:
            live = [rid for rid in added if rid not in aborted
                    and not (rid in outputs and outputs[rid].finished)]
            if live:
                victim = rng.choice(live)
                engine.abort_request(victim)
                aborted.add(victim)
        for output in engine.step():
            gather(outputs, output, params[output.request_id])
    return outputs, aborted


def seen(output) -> tuple[list, list | None]:
    """What a caller sees: per completion its tokens, text, finish and stop reasons and
    logprobs, and the prompt logprobs (token -> (logprob, rank) per position)."""
    def position(pos):
        return None if pos is None else {t: (lp.logprob, lp.rank) for t, lp in pos.items()}
    return ([(c.token_ids, c.text, c.finish_reason, c.stop_reason,
              None if c.logprobs is None else [position(p) for p in c.logprobs])
             for c in output.outputs],
            None if output.prompt_logprobs is None else
            [position(p) for p in output.prompt_logprobs])


def assert_close_logprobs(got, expected) -> None:
    """Logprobs equal up to rounding: another batch around a sequence changes their last bits,
    so a token's rank may move by a near-tie, and a top-k entry may swap with one as likely."""
    assert (got is None) == (expected is None)
    if expected is None:
        return
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert (mine is None) == (theirs is None)
        if theirs is None:
            continue
        for token in mine.keys() & theirs.keys():
            assert mine[token][0] == pytest.approx(theirs[token][0], abs=1e-4)
            assert abs(mine[token][1] - theirs[token][1]) <= 3
        for one, other in ((mine, theirs), (theirs, mine)):  # a top-k near-tie swapped
            for token in one.keys() - other.keys():
                assert any(abs(one[token][0] - v) <= 1e-4 for v, _ in other.values())


class Reference:
    """Each request alone in a roomy engine with prefix caching off."""

    def __init__(self, model: str):
        self.engine = LLMEngine.from_options(model, device="cpu", dtype="float32", block_size=16,
                                             num_gpu_blocks=64, max_model_len=MAX_MODEL_LEN,
                                             enable_prefix_caching=False)
        self.outputs = {}

    def __call__(self, request):
        key = repr(request)
        if key not in self.outputs:
            self.outputs[key] = seen(drive(self.engine, [request])[0][request[0]])
        return self.outputs[key]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (its model directory, its Reference), made once per module."""
    made = {}

    def get(arch: str) -> tuple[str, Reference]:
        if arch not in made:
            path = str(make_tiny_hf_model(tmp_path_factory.mktemp(arch) / "tiny", arch))
            made[arch] = path, Reference(path)
        return made[arch]
    yield get
    for _, reference in made.values():
        reference.engine.close()


def assert_as_alone(outputs, work, skip, reference, exact: bool):
    for request in work:
        if request[0] in skip:
            continue
        assert outputs[request[0]].finished
        if not exact:
            continue
        got, expected = seen(outputs[request[0]]), reference(request)
        assert [c[:4] for c in got[0]] == [c[:4] for c in expected[0]], request
        for mine, theirs in zip(got[0], expected[0]):
            assert_close_logprobs(mine[4], theirs[4])
        assert_close_logprobs(got[1], expected[1])


def run_case(model: str, seed: int, tmp_path, adjust=None) -> tuple:
    """Draw case ``seed``'s configuration (``adjust``ed in place) and workload and drive it
    on an engine; returns the open LLM, the configuration, the workload, the gathered outputs
    and the aborted ids."""
    rng = random.Random(seed)
    cfg = random_config(rng, tmp_path)
    work = random_workload(rng)
    if adjust is not None:
        adjust(cfg)
    llm = LLM(model, **cfg)
    if cfg.get("tier_fault_injection"):
        arm_faults(llm.engine, rng)
    outputs, aborted = drive(llm.engine, work, rng)
    return llm, cfg, work, outputs, aborted


@pytest.mark.parametrize("arch,seed", [("llama", s) for s in range(40)] + [
    (arch, s) for arch in ("gemma2", "mistral", "qwen3") for s in range(6)])
def test_random_configs_and_workloads_give_each_request_its_outputs_alone(
        arch, seed, models, tmp_path):
    """Gemma 2 and Mistral attend in sliding windows (Gemma 2 with soft-capping too), Qwen 3
    normalises q and k."""
    pytest.importorskip("xgrammar")
    model, reference = models(arch)
    llm, cfg, work, outputs, aborted = run_case(model, seed, tmp_path)
    exact = cfg.get("kv_cache_dtype") != "fp8"
    assert_all_released(llm)
    llm.close()
    assert_as_alone(outputs, work, aborted, reference, exact)

    if cfg.get("kv_offload") == "flash" and cfg["prefix_store"] != "off":
        again = random.Random(seed).sample(work, 4)
        llm = LLM(model, **cfg)
        outputs, _ = drive(llm.engine, again)
        assert_all_released(llm)
        llm.close()
        assert_as_alone(outputs, again, set(), reference, exact)


@pytest.mark.slow  # each case starts two processes (~3-5 s on the CPU VM)
@pytest.mark.parametrize("mode,seed", [("tp2", 0), ("tp2", 7), ("dp2", 3), ("dp2", 4)])
def test_random_configs_with_tensor_or_data_parallelism(mode, seed, models, tmp_path):
    """The same cases with tensor_parallel_size=2 (asynchronous scheduling off, which tensor
    parallelism refuses) or data_parallel_size=2 (a flash file per replica; no injected
    faults: the replicas' tiers live in their processes), against the one-process reference."""
    pytest.importorskip("xgrammar")
    model, reference = models("llama")

    def parallel(cfg: dict) -> None:
        if mode == "tp2":
            cfg.update(async_scheduling=False, tensor_parallel_size=2)
        else:
            cfg.update(data_parallel_size=2, tier_fault_injection=False)
            if "flash_path" in cfg:
                cfg["flash_path"] = str(tmp_path / "kv-{replica}.hifc")
    llm, cfg, work, outputs, aborted = run_case(model, seed, tmp_path, parallel)
    if mode == "tp2":
        assert_all_released(llm)
    else:
        settled(llm)  # every replica freed its blocks once the engine had nothing unfinished
    llm.close()
    assert_as_alone(outputs, work, aborted, reference, cfg.get("kv_cache_dtype") != "fp8")
