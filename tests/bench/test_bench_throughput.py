"""``hifc bench throughput`` end to end on the CPU with random:tiny-llama (no timing asserted)."""
import json

import pytest

TINY = ["--model", "random:tiny-llama", "--device", "cpu"]
# block 16 -> 8 KiB blocks; 24 blocks (384 tokens) cannot hold 8 requests of 64 + 48 tokens
PRESSURE = ["--input-len", "64", "--output-len", "48", "--num-prompts", "8", "--max-num-seqs",
            "8", "--block-size", "16", "--num-gpu-blocks", "24"]
VARIANT_KEYS = {
    "variant", "elapsed_s", "requests", "prompt_tokens", "output_tokens", "output_tokens_per_s",
    "total_tokens_per_s", "requests_per_s", "block_bytes", "gpu_blocks_total", "max_model_len",
    "preemptions", "swap_out_blocks", "swap_in_blocks", "tier_bytes_written", "tier_bytes_read",
    "swap_io_seconds", "swap_stall_seconds", "recomputed_sequences", "swap_failures", "steps",
    "tier_blocks_total", "tier_allocator", "trace_path", "ratio_to_dram", "tier_write_gibps",
    "step_ms_percentiles", "tier_backend", "swap_out_stall_seconds", "fraction_of_ideal",
    "fraction_of_sustained_ideal", "clocks",
    "prefix_cache_queries", "prefix_cache_hits", "prefix_store_queries", "prefix_store_hits",
    "prefix_store_recomputed", "prefix_store_bytes_read", "prefix_store_bytes_written",
    "per_replica", "flash_devices", "swap_out_blocks_freed_staged", "kernel_compiles",
    "tier_staging"}


def test_compare_all_variants_then_analysis_tools(hifc, tiers, tmp_path):
    """The GPU script's analysis stage in-process: every variant, FC trace, then wafsim, stall
    and endurance read what the benchmark wrote."""
    out, traces = tmp_path / "bench.json", tmp_path / "traces"
    # the prefix store off: every flash write is a swap-out (the trace WAF replays)
    code, stdout, _ = hifc("bench", "throughput", *TINY, *PRESSURE, *tiers, "--prefix-store",
                           "off", "--compare", "none,dram,flash,recompute,auto", "--json", out,
                           "--trace-dir", traces, "--no-progress")
    assert code == 0
    summary = json.loads(out.read_text())
    assert [r["variant"] for r in summary["variants"]] == ["none", "dram", "flash", "recompute",
                                                           "auto"]
    assert {"variants", "workload", "settings", "compare", "tps_ideal", "tps_test", "elapsed_s",
            "swap_out_blocks", "block_bytes", "tier_bytes_written",
            "tier_write_gibps"} <= set(summary)
    by = {r["variant"]: r for r in summary["variants"]}
    for r in by.values():
        assert set(r) == VARIANT_KEYS
        assert r["requests"] == 8 and r["output_tokens"] == 8 * 48
        assert r["kernel_compiles"] == []  # nothing compiles on the CPU
        assert r["output_tokens_per_s"] > 0 and r["swap_failures"] == 0
        assert 0 <= r["swap_out_stall_seconds"] <= r["swap_stall_seconds"]
        p = r["step_ms_percentiles"]
        assert 0 < p["p50"] <= p["p90"] <= p["p99"] <= p["max"] <= 1000 * r["elapsed_s"]
    assert by["dram"]["ratio_to_dram"] == 1.0
    assert by["none"]["preemptions"] == 0 and by["none"]["tier_allocator"] is None
    # every admission is a prefix cache query; the warm-up leaves nothing to reuse
    assert by["none"]["prefix_cache_queries"] == by["none"]["prompt_tokens"]
    assert by["none"]["prefix_cache_hits"] == 0
    for name in ("dram", "flash"):  # the budget forces swapping, and all of it comes back
        assert by[name]["swap_out_blocks"] > 0
        assert by[name]["swap_in_blocks"] == by[name]["swap_out_blocks"]
        assert by[name]["tier_bytes_written"] == by[name]["swap_out_blocks"] * 8192
    assert by["recompute"]["recomputed_sequences"] > 0 and by["recompute"]["swap_out_blocks"] == 0
    # flash swap-outs free their GPU blocks when staged, if the engine looks before the write
    # ends (a race here; tests/engine/test_swap_staged.py holds the writes to see it every
    # time); the DRAM copy ends its job at once
    assert 0 <= by["flash"]["swap_out_blocks_freed_staged"] <= by["flash"]["swap_out_blocks"]
    assert by["dram"]["swap_out_blocks_freed_staged"] == 0
    assert by["flash"]["tier_allocator"]["blocks_written"] == by["flash"]["swap_out_blocks"]
    assert by["flash"]["tier_backend"] == "posix"  # auto on a CPU cache
    assert by["dram"]["tier_backend"] is None and by["none"]["tier_backend"] is None
    assert by["flash"]["tier_staging"]["staging_sets"] >= 2 and by["dram"]["tier_staging"] is None
    assert summary["workload"]["kind"] == "fixed" and summary["settings"]["block_size"] == 16
    ideal = summary["workload"]["ideal"]
    assert ideal["ideal_decode_steps"] == 47  # 8 sequences decode together, 48 - 1 steps
    assert ideal["ideal_s"] == pytest.approx(ideal["ideal_prefill_s"] + ideal["ideal_decode_s"])
    assert ideal["ideal_sustained_s"] == pytest.approx(
        ideal["ideal_sustained_prefill_s"] + ideal["ideal_decode_s"])
    assert ideal["ideal_sustained_prefill_s"] == pytest.approx(
        ideal["ideal_prefill_s"] * ideal["matmul_tflops"] / ideal["sustained_tflops"])
    for r in by.values():
        assert r["fraction_of_ideal"] == pytest.approx(ideal["ideal_s"] / r["elapsed_s"])
        assert r["fraction_of_sustained_ideal"] == pytest.approx(
            ideal["ideal_sustained_s"] / r["elapsed_s"])
    assert "physical ideal" in stdout and "x ideal" in stdout and "x sust" in stdout
    assert summary["tps_test"] == by["flash"]["output_tokens_per_s"]
    assert summary["tps_ideal"] == by["none"]["output_tokens_per_s"]
    trace = traces / "flash.trace"
    assert by["flash"]["trace_path"] == str(trace) and (traces / "auto.trace").exists()
    assert by["dram"]["trace_path"] is None
    assert "variant" in stdout and "x dram" in stdout

    waf = tmp_path / "waf.json"
    assert hifc("wafsim", "--trace", trace, "--block-bytes", "8192", "--page-bytes", "4096",
                "--pages-per-erase-block", "8", "--json", waf)[0] == 0
    assert json.loads(waf.read_text())["host_block_writes"] == by["flash"]["swap_out_blocks"]
    stall, endurance = tmp_path / "stall.json", tmp_path / "endurance.json"
    # --tps-ideal overrides the file's: on a busy CPU flash can measure faster than `none`,
    # which `hifc stall` rejects (tps_test > tps_ideal)
    assert hifc("stall", "--from-bench", out, "--tps-ideal", "1e12", "--json", stall)[0] == 0
    assert json.loads(stall.read_text())["swap_out_blocks"] == by["flash"]["swap_out_blocks"]
    assert hifc("endurance", "--from-bench", out, "--json", endurance)[0] == 0
    assert json.loads(endurance.read_text())["lifetime_years"] > 0


def test_sharegpt_workload_with_the_progress_bar(hifc, tiers, tmp_path):
    out = tmp_path / "sharegpt.json"
    code, _, stderr = hifc("bench", "throughput", *TINY, *tiers, "--sharegpt",
                           "--sharegpt-max-conversations", "200", "--num-prompts", "4",
                           "--output-len", "16", "--max-num-seqs", "4", "--block-size", "16",
                           "--num-gpu-blocks", "40", "--compare", "dram", "--json", out)
    assert code == 0
    workload = json.loads(out.read_text())["workload"]
    assert workload["kind"] == "sharegpt" and workload["records_read"] == 200
    assert workload["length_tokenizer"] in ("smollm2-135m", "utf8-bytes/4")
    assert workload["num_prompts"] == 4 and workload["output_tokens_mean"] == 16
    assert workload["input_tokens_min"] >= 4
    assert "dram: 100%" in stderr  # tqdm


def test_sharegpt_from_a_file_with_reply_lengths(hifc, tiers, tmp_path):
    records = [{"conversations": [{"from": "human", "value": "word " * (10 + i)},
                                  {"from": "gpt", "value": "reply " * (8 + i)}]}
               for i in range(6)]
    data = tmp_path / "conversations.json"
    data.write_text(json.dumps(records)[:-40])  # truncated, like the packaged file
    out = tmp_path / "out.json"
    code, _, _ = hifc("bench", "throughput", *TINY, *tiers, "--sharegpt", "--sharegpt-path", data,
                      "--num-prompts", "3", "--block-size", "16", "--num-gpu-blocks", "40",
                      "--compare", "recompute", "--json", out, "--no-progress")
    assert code == 0
    workload = json.loads(out.read_text())["workload"]
    assert workload["records_read"] == 5 and workload["source"] == str(data)
    assert workload["output_tokens_min"] >= 4


def test_each_variant_runs_with_its_engine_heap_frozen(hifc, tiers, monkeypatch):
    """Each variant's engine serves with its start-up state out of the collector's reach, and
    the heap is unfrozen before the engine closes (so that it can be collected)."""
    import gc

    from hifc.bench import throughput

    frozen = []
    run_variant = throughput.run_variant

    def watched(engine, name, *args, **kwargs):
        frozen.append((name, gc.get_freeze_count()))
        return run_variant(engine, name, *args, **kwargs)

    monkeypatch.setattr(throughput, "run_variant", watched)
    code, _, _ = hifc("bench", "throughput", *TINY, *PRESSURE, *tiers, "--compare",
                      "recompute,none", "--no-progress")
    assert code == 0 and [name for name, _ in frozen] == ["recompute", "none"]
    assert all(count > 0 for _, count in frozen) and gc.get_freeze_count() == 0


def test_profile_workload(hifc, tmp_path):
    out = tmp_path / "profile.json"
    code, stdout, _ = hifc("bench", "throughput", *TINY, "--profile", "qasper", "--output-len",
                           "4", "--num-prompts", "2", "--block-size", "16", "--num-gpu-blocks",
                           "30", "--compare", "recompute", "--json", out, "--no-progress")
    assert code == 0
    workload = json.loads(out.read_text())["workload"]
    assert workload["profile"] == "qasper" and workload["output_tokens"] == 4
    assert workload["input_tokens_max"] <= 30 * 16 - 4  # clipped to max_model_len
    assert "profile qasper" in stdout


@pytest.mark.parametrize("extra, overrides, message", [
    ([], {}, "exactly one of --profile, --input-len and --sharegpt"),
    (["--input-len", "8", "--sharegpt"], {}, "got --input-len and --sharegpt"),
    (["--input-len", "8"], {"--compare": "dram,ssd"}, "unknown variant(s) ['ssd']"),
    (["--input-len", "8"], {"--compare": "dram,dram"}, "lists a variant twice"),
    (["--input-len", "8"], {"--compare": ","}, "unknown variant"),
    (["--input-len", "8"], {"--num-gpu-blocks": None}, "give a KV budget"),
    (["--input-len", "8"], {"--flash-path": None}, "needs --flash-path"),
    (["--input-len", "8"], {"--compare": "dram", "--swap-space": None,
                            "--flash-size-gib": None}, "needs --swap-space"),
    (["--input-len", "8", "--num-prompts", "0"], {}, "--num-prompts must be positive"),
    (["--input-len", "0"], {}, "--input-len must be positive"),
    (["--input-len", "8", "--output-len", "-1"], {}, "--output-len must be positive"),
    (["--input-len", "500", "--output-len", "100"], {}, "exceeds max_model_len 384"),
    (["--input-len", "8", "--sharegpt-max-conversations", "5"], {}, "need --sharegpt"),
    (["--sharegpt", "--sharegpt-path", "/nonexistent/x.json"], {}, "cannot read"),
    (["--sharegpt", "--sharegpt-max-conversations", "0"], {}, "must be positive"),
    (["--input-len", "8"], {"--model": "random:nope"}, "unknown random preset"),
])
def test_bad_input_is_a_clear_error(hifc, tiers, extra, overrides, message):
    options = {"--model": "random:tiny-llama", "--device": "cpu", "--block-size": "16",
               "--num-gpu-blocks": "24", "--compare": "dram,flash",
               **dict(zip(tiers[::2], tiers[1::2])), **overrides}
    argv = [x for key, value in options.items() if value is not None for x in (key, value)]
    code, _, stderr = hifc("bench", "throughput", "--no-progress", *argv, *extra)
    assert code == 2
    assert message in stderr


@pytest.mark.parametrize("argv", [["--profile", "nope"], ["--block-size", "48"],
                                  ["--input-len", "x"]])
def test_argparse_rejects_malformed_options(hifc, argv):
    with pytest.raises(SystemExit) as exc:
        hifc("bench", "throughput", *TINY, *argv)
    assert exc.value.code == 2


def test_step_percentiles_pick_ranks():
    from hifc.bench.throughput import step_percentiles_ms
    steps = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert step_percentiles_ms(steps) == pytest.approx({"p50": 51, "p90": 91, "p99": 100,
                                                        "max": 100})
    assert step_percentiles_ms([]) == {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
