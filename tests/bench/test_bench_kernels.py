"""``hifc bench kernels`` end to end on the CPU with tiny random presets (no timing asserted)."""
import dataclasses
import json

import pytest

from hifc.models.presets import PRESETS

SMALL = ["--device", "cpu", "--dtype", "float32", "--batch-sizes", "1,3", "--context", "40",
         "--steps", "2", "--warmup", "1", "--prefill-len", "96", "--prefill-repeats", "2",
         "--block-size", "16"]
ROW_KEYS = {"batch", "context", "steps", "step_ms", "synced_step_ms", "tokens_per_s", "bytes_read",
            "floor_ms", "step_over_floor", "graph_steps", "clocks"}


def matmul_params(arch) -> tuple[int, int]:
    """(decoder layers + final norm, lm_head) parameter counts from the preset's shapes."""
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    layer = (2 * arch.hidden_size * q + 2 * arch.hidden_size * kv
             + 3 * arch.hidden_size * arch.intermediate_size + 2 * arch.hidden_size
             + (q + 2 * kv if arch.attention_bias else 0))
    return arch.num_hidden_layers * layer + arch.hidden_size, arch.vocab_size * arch.hidden_size


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])  # qwen2: tied lm_head, biases
def test_kernels_reports_decode_floor_and_prefill_fraction(hifc, tmp_path, preset):
    out = tmp_path / "kernels.json"
    code, stdout, _ = hifc("bench", "kernels", "--model", f"random:{preset}", *SMALL,
                           "--json", out)
    assert code == 0
    result = json.loads(out.read_text())
    assert {"model", "dtype", "device", "copy_gbps", "matmul_tflops", "sustained_matmul_tflops",
            "decode", "prefill"} <= set(result)
    assert (result["model"], result["dtype"], result["device"]) == (f"random:{preset}",
                                                                    "float32", "cpu")
    assert result["copy_gbps"] > 0 and result["matmul_tflops"] > 0
    assert result["sustained_matmul_tflops"] > 0 and result["hf_overrides"] is None

    arch = PRESETS[preset]
    body, head = matmul_params(arch)
    weight_bytes = 4 * (body + head)
    kv_token_bytes = 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * 4
    assert result["weight_bytes_read"] == weight_bytes
    assert [r["batch"] for r in result["decode"]] == [1, 3]
    for r in result["decode"]:
        assert set(r) == ROW_KEYS
        assert r["context"] == 40 and r["steps"] == 2 and r["graph_steps"] == 0  # CPU: eager
        assert r["step_ms"] > 0 and r["tokens_per_s"] == pytest.approx(
            1000 * r["batch"] / r["step_ms"])
        assert r["bytes_read"] == weight_bytes + r["batch"] * (40 + 1 + 2) * kv_token_bytes
        assert r["floor_ms"] == pytest.approx(1000 * r["bytes_read"] / (result["copy_gbps"] * 1e9))
        assert r["step_over_floor"] == pytest.approx(r["step_ms"] / r["floor_ms"])

    p = result["prefill"]
    assert set(p) == {"tokens", "seconds", "tflops", "fraction_of_matmul", "fraction_of_sustained",
                      "tokens_per_s", "clocks"}
    assert p["clocks"] is None  # no GPU clock to sample on the CPU
    assert p["tokens"] == 96 and p["seconds"] > 0
    assert p["tokens_per_s"] == pytest.approx(96 / p["seconds"])
    # the last layer's output projection, MLP and attention on the last token alone
    tail = arch.hidden_size * (arch.num_attention_heads * arch.head_dim
                               + 3 * arch.intermediate_size)
    per_key = 4 * arch.num_attention_heads * arch.head_dim
    flops = 2 * body * 96 - 2 * tail * 95 + 2 * head \
        + per_key * ((arch.num_hidden_layers - 1) * 96 ** 2 / 2 + 96)
    assert p["tflops"] == pytest.approx(flops / p["seconds"] / 1e12)
    assert p["fraction_of_matmul"] == pytest.approx(p["tflops"] / result["matmul_tflops"])
    assert p["fraction_of_sustained"] == pytest.approx(
        p["tflops"] / result["sustained_matmul_tflops"])
    assert "step/floor" in stdout and "of the matmul rate" in stdout
    assert "of the sustained rate" in stdout


@pytest.mark.parametrize("argv", [["--batch-sizes", "1,0"], ["--batch-sizes", "1,x"],
                                  ["--context", "0"], ["--steps", "-1"], ["--prefill-len", "0"],
                                  ["--prefill-repeats", "0"], ["--warmup", "0"]])
def test_argparse_rejects_non_positive_options(argparse_rejects, argv):
    argparse_rejects("bench", "kernels", *argv)


@pytest.mark.parametrize("argv, message", [
    (["--max-num-batched-tokens", "256", "--prefill-len", "512"],
     "--max-num-batched-tokens 256 is below max_model_len 513"),
    (["--max-model-len", "64", "--prefill-len", "128"], "--max-model-len 64 is below the 129"),
    (["--prefill-len", "2000"], "exceeds the model's context length 1024"),
])
def test_sizes_the_engine_cannot_hold_are_refused(hifc, argv, message):
    code, _, stderr = hifc("bench", "kernels", "--model", "random:tiny-llama", "--device", "cpu",
                           "--batch-sizes", "1", "--context", "16", *argv)
    assert code == 2
    assert message in stderr


def pool_needs(batches, context=40, block_size=16):
    """The KV blocks each of SMALL's batches needs, as the benchmark counts them."""
    from hifc.bench import kernels
    max_tokens = kernels.decode_max_tokens(batches, context, 2, 1,
                                           kernels.DEFAULT_BATCHED_TOKENS)
    return [kernels.kv_blocks(b, context + max_tokens, block_size) for b in batches]


def test_batches_the_pool_cannot_hold_are_skipped(hifc, tmp_path):
    one, three = pool_needs([1, 3])
    out = tmp_path / "kernels.json"
    code, stdout, _ = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--num-gpu-blocks", str(one), "--json", out)
    assert code == 0
    measured, skipped = json.loads(out.read_text())["decode"]
    assert set(measured) == ROW_KEYS and measured["batch"] == 1
    assert skipped == {"batch": 3, "context": 40,
                       "skipped": f"needs {three} KV blocks, the pool holds {one}"}
    assert f"skipped: needs {three} KV blocks" in stdout
    code, _, stderr = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--num-gpu-blocks", str(one - 1))
    assert code == 2
    assert f"no batch of --batch-sizes fits the KV pool of {one - 1} blocks" in stderr


def test_a_sized_pool_past_the_device_gives_way_to_the_engines_sizing(hifc, monkeypatch,
                                                                       tmp_path, caplog):
    from hifc.engine.limits import KVPoolTooLarge
    from hifc.engine.llm_engine import LLMEngine

    one, _ = pool_needs([1, 3])
    load = LLMEngine.from_options
    calls = []

    def device_sized(*args, **options):
        # the benchmark's pool does not fit; the engine's own holds batch 1 only
        calls.append(options.get("num_gpu_blocks"))
        if options.get("num_gpu_blocks") is not None:
            raise KVPoolTooLarge("a KV cache of 9 blocks (68.1 GiB) does not fit")
        return load(*args, **options, num_gpu_blocks=one)

    monkeypatch.setattr(LLMEngine, "from_options", device_sized)
    out = tmp_path / "kernels.json"
    code, _, stderr = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--json", out)
    assert code == 0
    assert calls[0] > one and calls[1:] == [None]
    assert "does not fit; the pool was sized for the largest batch" in caplog.text
    assert ["skipped" in r for r in json.loads(out.read_text())["decode"]] == [False, True]
    # a pool given on the command line is not resized
    calls.clear()
    code, _, stderr = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--num-gpu-blocks", "9")
    assert code == 2 and "does not fit" in stderr and calls == [9]


def test_a_given_pool_without_room_for_a_large_step_is_admitted_in_smaller_steps(
        hifc, monkeypatch, tmp_path, caplog):
    from hifc.engine.limits import StepTooLarge
    from hifc.engine.llm_engine import LLMEngine

    load = LLMEngine.from_options
    calls = []

    def step_limited(*args, **options):
        # the given pool fits, but not beside a step of the benchmark's 65,536 tokens
        calls.append(options["max_num_batched_tokens"])
        if options["max_num_batched_tokens"] > options["max_model_len"]:
            raise StepTooLarge("a KV cache of 40 blocks (0.0 GiB) leaves 0.1 GiB free")
        return load(*args, **options)

    monkeypatch.setattr(LLMEngine, "from_options", step_limited)
    out = tmp_path / "kernels.json"
    code, _, stderr = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--num-gpu-blocks", "40", "--json", out)
    assert code == 0, stderr
    result = json.loads(out.read_text())
    model_len = 96 + 1  # --prefill-len 96 in one step is the longest sequence
    assert calls == [65536, model_len] and result["max_num_batched_tokens"] == model_len
    assert "admitting with max_num_batched_tokens 97 instead" in caplog.text
    assert [r["batch"] for r in result["decode"] if "skipped" not in r] == [1, 3]
    # a step budget given on the command line is not changed
    calls.clear()
    code, _, stderr = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--num-gpu-blocks", "40", "--max-num-batched-tokens", "300")
    assert code == 2 and "leaves 0.1 GiB free" in stderr and calls == [300]


def test_profile_lists_the_host_functions_of_decode_steps(hifc, tmp_path):
    out = tmp_path / "kernels.json"
    code, stdout, _ = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--profile", "--json", out)
    assert code == 0
    for r in json.loads(out.read_text())["decode"]:
        assert "kernels" not in r and "timeline" not in r  # CPU: no graph, no device trace
        functions = r["host_functions"]
        assert 0 < len(functions) <= 12
        assert all(f["calls"] > 0 and f["ms_per_step"] >= 0 for f in functions)
        assert any("step" in f["function"] or "forward" in f["function"] for f in functions)
    assert "ms/step host" in stdout


def test_timeline_counts_overlapping_launches_once_and_names_idle_stretches():
    from hifc.bench.probes import timeline

    def event(name, ts, dur, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    step = [event("gemv", 0, 10), event("attention", 8, 6),  # launched early: overlaps
            event("merge", 9, 7), event("argmax", 20, 3),  # 4 us idle before the argmax
            event("Memcpy DtoH", 25, 1, "gpu_memcpy")]  # 2 us idle before the copy
    events = [dict(e, ts=e["ts"] + 30 * i) for i in range(2) for e in step]  # 4 us between steps
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::argmax", "ts": 0, "dur": 500},
               {"ph": "i", "cat": "kernel", "name": "marker", "ts": 3}]  # host, instant: ignored
    t = timeline(events, steps=2)
    assert t["steps"] == 2
    assert t["span_ms"] * 1000 == pytest.approx(28)  # 56 us over two steps
    assert t["busy_ms"] * 1000 == pytest.approx(20)  # 16 + 3 + 1 per step
    assert t["idle_ms"] * 1000 == pytest.approx(8)  # (4 + 2) per step, and 4 once between steps
    assert [k["name"] for k in t["kernels"][:2]] == ["gemv", "merge"]
    assert t["kernels"][0] == {"name": "gemv", "calls": 1.0, "ms": pytest.approx(0.010)}
    gaps = {(g["after"], g["before"]): (g["count"], g["us"]) for g in t["idle"]}
    assert gaps == {("merge", "argmax"): (1.0, pytest.approx(4.0)),
                    ("argmax", "Memcpy DtoH"): (1.0, pytest.approx(2.0)),
                    ("Memcpy DtoH", "gemv"): (0.5, pytest.approx(2.0))}
    # with more copies to the host than steps, the window runs from the end of the first to
    # the end of the copy `steps` later: the second step, and the idle stretch before it
    one = timeline(events, steps=1)
    assert (one["span_ms"] * 1000, one["busy_ms"] * 1000) == (pytest.approx(30), pytest.approx(20))
    assert {(g["after"], g["before"]): g["us"] for g in one["idle"]}[None, "gemv"] == 4
    assert [k["calls"] for k in one["kernels"]] == [1.0] * 5
    assert timeline([step[0]], steps=1)["idle_ms"] == 0
    assert timeline([], steps=1) == {}


def test_decode_steps_run_with_the_startup_heap_frozen(hifc, monkeypatch):
    """The timed steps run with the engine's start-up state out of the collector's reach (a
    full collection over it stalled a step by ~0.2 s), unfrozen once the run is over."""
    import gc

    from hifc.bench import kernels

    frozen = []
    measure = kernels.measure_decode

    def watched(*args, **kwargs):
        frozen.append(gc.get_freeze_count())
        return measure(*args, **kwargs)

    monkeypatch.setattr(kernels, "measure_decode", watched)
    code, _, _ = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL)
    assert code == 0 and len(frozen) == 2 and min(frozen) > 0
    assert gc.get_freeze_count() == 0


def test_decode_returns_every_token_its_delta_outputs_gave():
    """The timed requests ask for delta outputs; the tokens returned (prefill, warm-up and timed
    steps) are each request's whole greedy sequence, as a fresh generation gives it."""
    from hifc.bench import kernels
    from hifc.bench.workloads import fixed_requests
    from hifc.engine.llm_engine import LLMEngine
    from hifc.sampling_params import SamplingParams

    options = dict(model="random:tiny-llama", device="cpu", dtype="float32", block_size=16,
                   num_gpu_blocks=64, seed=0)
    engine = LLMEngine.from_options(**options)
    _, tokens = kernels.measure_decode(engine, batch=3, context=40, steps=2, warmup=1,
                                       max_tokens=8)
    assert [len(t) for t in tokens] == [1 + 1 + 2 + 2] * 3  # prefill, warm-up, two timed runs
    prompts = fixed_requests(40, 8, 3, engine.arch.vocab_size, seed=3)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    fresh = LLMEngine.from_options(**options)
    for i, p in enumerate(prompts):
        fresh.add_request(str(i), p.prompt_token_ids, params)
    done = {}
    while fresh.has_unfinished_requests():
        done.update({o.request_id: o.outputs[0].token_ids for o in fresh.step() if o.finished})
    assert [done[str(i)] for i in range(3)] == tokens


def test_kernels_of_a_preset_cut_by_hf_overrides_count_its_layers(hifc, tmp_path):
    out = tmp_path / "kernels.json"
    cut = '{"num_hidden_layers": 1}'
    code, stdout, _ = hifc("bench", "kernels", "--model", "random:tiny-llama", *SMALL,
                           "--batch-sizes", "1", "--hf-overrides", cut, "--json", out)
    assert code == 0
    result = json.loads(out.read_text())
    assert result["model"] == "random:tiny-llama" and result["hf_overrides"] == cut
    assert f"(hf_overrides {cut})" in stdout
    arch = dataclasses.replace(PRESETS["tiny-llama"], num_hidden_layers=1)
    assert result["weight_bytes_read"] == 4 * sum(matmul_params(arch))


def test_bench_decode_names_the_overrides_it_ran_with(hifc, tmp_path):
    out = tmp_path / "decode.json"
    cut = '{"num_hidden_layers": 1}'
    code, stdout, _ = hifc("bench", "decode", "--model", "random:tiny-llama", "--device", "cpu",
                           "--dtype", "float32", "--batch-sizes", "1", "--context", "16",
                           "--steps", "2", "--hf-overrides", cut, "--json", out)
    assert code == 0 and f"(hf_overrides {cut})" in stdout
    result = json.loads(out.read_text())
    assert result["hf_overrides"] == cut and [r["batch"] for r in result["results"]] == [1]


def test_bench_decode_times_decode_steps_alone_when_prompts_take_several_steps(hifc,
                                                                               monkeypatch):
    """Prompts of 3 x 200 tokens against a 256-token step budget take three prefill steps;
    timing starts once every sequence has its prompt in the cache, and every sequence still
    runs when it ends (the first prompts decode while the later ones are prefilled)."""
    from hifc.bench import decode
    from hifc.engine.llm_engine import LLMEngine

    engines, at_sync = [], []
    build = LLMEngine.from_options
    monkeypatch.setattr(LLMEngine, "from_options",
                        lambda *a, **o: engines.append(build(*a, **o)) or engines[-1])

    def sync(device):  # before the timed steps, and after them
        scheduler = engines[0].scheduler
        at_sync.append((len(scheduler.waiting),
                         [s.num_computed_tokens >= 200 for s in scheduler.running]))

    monkeypatch.setattr(decode, "sync", sync)
    code, stdout, stderr = hifc("bench", "decode", "--model", "random:tiny-llama", "--device",
                                "cpu", "--dtype", "float32", "--batch-sizes", "3", "--context",
                                "200", "--steps", "2", "--max-num-batched-tokens", "256")
    assert code == 0, stderr
    assert at_sync == [(0, [True, True, True])] * 2
    assert engines[0].stats()["preemptions"] == 0
    assert not engines[0].has_unfinished_requests()
