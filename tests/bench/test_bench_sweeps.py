"""``hifc bench sweep`` (Fig 3, 4, 6) end to end on the CPU with random:tiny-llama: JSON + PNG."""
import json

import pytest

from hifc.bench.sweeps import FIGURES

TINY = ["--model", "random:tiny-llama", "--device", "cpu", "--num-prompts", "4",
        "--max-num-seqs", "4", "--no-progress"]
POINT_KEYS = {"panel", "x", "input_len", "output_len", "max_num_seqs", "block_size", "workload",
              "variants"}


def run_sweep(hifc, tmp_path, figure, *argv):
    out, png = tmp_path / f"{figure}.json", tmp_path / f"{figure}.png"
    code, stdout, _ = hifc("bench", "sweep", "--figure", figure, *TINY, *argv, "--json", out,
                           "--plot", png)
    assert code == 0
    sweep = json.loads(out.read_text())
    assert {"figure", "paper", "title", "compare", "num_prompts", "settings",
            "points"} <= set(sweep)
    for point in sweep["points"]:
        assert POINT_KEYS <= set(point)
        assert [r["variant"] for r in point["variants"]] == sweep["compare"]
        assert point["workload"]["input_len"] == point["input_len"]
        assert point["workload"]["output_len"] == point["output_len"]
        for r in point["variants"]:
            assert r["requests"] == 4 and r["output_tokens_per_s"] > 0
            assert r["swap_failures"] == 0
    assert f"{sweep['paper']}-like sweep" in stdout
    return sweep, png


def test_io_length_sweep_fig3(hifc, tiers, tmp_path, assert_png):
    sweep, png = run_sweep(hifc, tmp_path, "io-length", *tiers, "--kv-cache-gib", "0.0002",
                           "--input-lens", "32,64", "--output-lens", "16,48",
                           "--input-len", "48", "--output-len", "16")
    assert sweep["paper"] == "Fig 3" and sweep["compare"] == ["dram", "flash"]
    assert [(p["panel"], p["input_len"], p["output_len"]) for p in sweep["points"]] == [
        ("input_len", 32, 16), ("input_len", 64, 16), ("output_len", 48, 16),
        ("output_len", 48, 48)]
    assert all(p["max_num_seqs"] == 4 and p["block_size"] == 64 for p in sweep["points"])
    assert sweep["settings"]["kv_cache_gib"] == 0.0002
    assert_png(png, min_bytes=5000)


def test_concurrency_sweep_fig4_with_recompute(hifc, tiers, tmp_path, assert_png):
    sweep, png = run_sweep(hifc, tmp_path, "concurrency", *tiers, "--kv-cache-gib", "0.0002",
                           "--concurrency", "1,4", "--input-len", "48", "--output-len", "24",
                           "--compare", "dram,recompute")
    assert [p["max_num_seqs"] for p in sweep["points"]] == [1, 4]
    assert [p["x"] for p in sweep["points"]] == [1, 4]
    last = sweep["points"][-1]["variants"]
    assert last[0]["swap_out_blocks"] > 0 and last[1]["recomputed_sequences"] > 0
    assert sweep["points"][0]["variants"][0]["preemptions"] == 0  # one at a time fits
    assert_png(png, min_bytes=5000)


def test_block_size_sweep_fig6(hifc, tiers, tmp_path, assert_png):
    sweep, png = run_sweep(hifc, tmp_path, "block-size", *tiers, "--kv-cache-gib", "0.00015",
                           "--block-sizes", "16,32", "--input-len", "48", "--output-len", "40")
    assert [(p["block_size"], p["variants"][0]["block_bytes"]) for p in sweep["points"]] == [
        (16, 8192), (32, 16384)]
    assert all("swap_io_seconds" in r for p in sweep["points"] for r in p["variants"])
    assert sweep["points"][0]["variants"][1]["swap_out_blocks"] > 0
    assert_png(png, min_bytes=5000)


def test_figure_defaults_are_the_papers_8b_settings():
    assert FIGURES["io-length"].max_num_seqs == 10  # batch 10
    assert FIGURES["concurrency"].concurrency[-1] == 20
    fig4 = FIGURES["concurrency"]
    assert fig4.input_len + fig4.output_len == 5120 and fig4.kv_cache_gib == 9.1
    fig6 = FIGURES["block-size"]
    assert fig6.block_sizes == (16, 32, 64, 128, 256)
    assert fig6.input_len + fig6.output_len == 10240 and fig6.max_num_seqs == 10


@pytest.mark.parametrize("argv, message", [
    (["--figure", "io-length", "--concurrency", "1,2"], "--concurrency applies to --figure "
                                                        "concurrency"),
    (["--figure", "concurrency", "--input-lens", "8"], "--input-lens applies to --figure "
                                                       "io-length"),
    (["--figure", "block-size", "--block-sizes", "16,48"], "block sizes must be from"),
    (["--figure", "block-size", "--num-gpu-blocks", "20"], "needs --kv-cache-gib"),
    (["--figure", "io-length", "--input-lens", "", "--output-lens", ""], "no point to run"),
    (["--figure", "concurrency", "--compare", "dram,nvme"], "unknown variant"),
    (["--figure", "concurrency", "--flash-path", None], "needs --flash-path"),
    (["--figure", "concurrency", "--num-prompts", "0"], "--num-prompts must be positive"),
    (["--figure", "concurrency", "--input-len", "-3"], "must be positive"),
    (["--figure", "concurrency", "--concurrency", "300", "--max-num-batched-tokens", "256"],
     "max_num_batched_tokens (256) must be at least max_num_seqs (300)"),
    (["--figure", "io-length", "--input-lens", "2000", "--kv-cache-gib", "0.0002"],
     "exceeds max_model_len"),
])
def test_bad_input_is_a_clear_error(hifc, tiers, argv, message):
    options = dict(zip(tiers[::2], tiers[1::2]))
    extra = []
    for flag, value in zip(argv[::2], argv[1::2]):
        if flag in options:
            options[flag] = value
        else:
            extra += [flag, value]
    argv = [x for k, v in options.items() if v is not None for x in (k, v)] + extra
    code, _, stderr = hifc("bench", "sweep", "--model", "random:tiny-llama", "--device", "cpu",
                           "--no-progress", "--kv-cache-gib", "0.0002", *argv)
    assert code == 2
    assert message in stderr


@pytest.mark.parametrize("argv", [["--figure", "fig9"], ["--figure", "concurrency",
                                                         "--concurrency", "1,x"],
                                  ["--figure", "block-size", "--block-sizes", "0"]])
def test_argparse_rejects_malformed_options(argparse_rejects, argv):
    argparse_rejects("bench", "sweep", *argv)
