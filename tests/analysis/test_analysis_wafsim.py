import json

import numpy as np
import pytest

from hifc.analysis.swaptrace import SwapTrace, SwapWorkload, generate, load_trace
from hifc.analysis.wafsim import WafSimConfig, page_writes, replay

SMALL_DRIVE = dict(block_bytes=16 << 14, page_bytes=16 << 10, pages_per_erase_block=512)


def test_append_beats_left_append_on_the_same_workload():
    for seed in range(3):
        workload = SwapWorkload(tier_blocks=1024, swap_outs=600, seed=seed)
        config = WafSimConfig(tier_blocks=1024, **SMALL_DRIVE)
        append = replay(generate(workload, "append"), config)
        left = replay(generate(workload, "left-append"), config)
        assert append.host_page_writes > 0
        assert left.waf > 1.5 and append.waf < left.waf - 0.3


def test_append_policy_writes_the_tier_as_a_circular_log():
    workload = SwapWorkload(tier_blocks=512, swap_outs=300, fill=0.9, seed=4)
    ids = generate(workload, "append").block_ids
    steps = np.diff(ids)
    assert ids.max() < 512
    assert (steps > 0).sum() + (steps < 0).sum() == steps.size      # never the same block twice
    assert (steps < 0).sum() <= ids.size // (0.9 * 512 * 0.5)       # backward steps only wrap
    left_ids = generate(workload, "left-append").block_ids
    assert left_ids.max() < int(0.9 * 512)                           # lowest free ids only


def test_generator_is_deterministic_per_seed():
    workload = SwapWorkload(tier_blocks=256, swap_outs=100, seed=7)
    first, second = generate(workload, "left-append"), generate(workload, "left-append")
    assert np.array_equal(first.block_ids, second.block_ids)
    with pytest.raises(ValueError, match="does not fit"):
        SwapWorkload(tier_blocks=32, min_seq_blocks=4, max_seq_blocks=32, fill=0.5)


def test_repeated_block_in_a_trace_counts_every_write():
    writes = page_writes(np.array([3, 3, 5, 3]), pages_per_block=4)
    assert [w.tolist() for w in writes] == [[12, 13, 14, 15], [12, 13, 14, 15, 20, 21, 22, 23],
                                            [12, 13, 14, 15]]
    trace = SwapTrace((np.array([3, 3, 5, 3]),), "test")
    res = replay(trace, WafSimConfig(tier_blocks=8, block_bytes=4096, page_bytes=4096,
                                     pages_per_erase_block=1, over_provisioning=0.5))
    assert res.host_page_writes == 4


@pytest.mark.parametrize("text, expected", [
    ("0\n1\n2\n", [[0], [1], [2]]),
    ("# header\n0 1, 2\n\n3  # tail\n", [[0, 1, 2], [3]]),
    ("[0, 1, 2]", [[0], [1], [2]]),
    ("[[0, 1], [2]]", [[0, 1], [2]]),
    ('{"block_ids": [[4], 5]}', [[4], [5]]),
])
def test_trace_formats(tmp_path, text, expected):
    path = tmp_path / "trace.txt"
    path.write_text(text)
    assert [g.tolist() for g in load_trace(path).swap_outs] == expected


def test_allocator_export_header_gives_the_tier_capacity(cli, tmp_path):
    path, out = tmp_path / "fc_trace.txt", tmp_path / "w.json"
    path.write_text("# hifc FC block write trace: policy=append num_blocks=256\n"
                    + "".join(f"{i % 256}\n" for i in range(1024)))
    trace = load_trace(path)
    assert trace.tier_blocks == 256 and trace.num_block_writes == 1024 and not trace.grouped
    assert cli("wafsim", "--trace", path, "--pages-per-erase-block", 256, "--json", out) == 0
    data = json.loads(out.read_text())
    assert data["tier_blocks"] == 256 and data["waf"] == 1.0


def test_cli_synthetic_round_trips_through_a_trace_file(cli, tmp_path, capsys, assert_png):
    out, png, saved = tmp_path / "w.json", tmp_path / "w.png", tmp_path / "trace.txt"
    assert cli("wafsim", "--policy", "left-append", "--swap-outs", 300, "--json", out,
               "--plot", png, "--save-trace", saved, "--tier-blocks", 1024,
               "--pages-per-erase-block", 512) == 0
    assert "WAF" in capsys.readouterr().out
    data = json.loads(out.read_text())
    for key in ("waf", "host_page_writes", "nand_page_writes", "gc_count", "gc_relocated_pages",
                "swap_outs", "pages_per_tier_block"):
        assert key in data
    assert data["swap_outs"] == 300 and data["source"] == "synthetic:left-append"
    assert data["waf"] == pytest.approx(data["nand_page_writes"] / data["host_page_writes"])
    assert_png(png, min_bytes=1000)
    replayed = tmp_path / "w2.json"
    assert cli("wafsim", "--trace", saved, "--json", replayed, "--pages-per-erase-block", 512) == 0
    again = json.loads(replayed.read_text())
    assert again["tier_blocks"] == 1024                                # from the header
    assert again["waf"] == data["waf"] and again["host_block_writes"] == data["host_block_writes"]


def test_cli_json_list_trace_and_plot(cli, tmp_path, assert_png):
    trace, out, png = tmp_path / "t.json", tmp_path / "w.json", tmp_path / "w.png"
    trace.write_text(json.dumps(list(range(64)) * 5))
    assert cli("wafsim", "--trace", trace, "--block-bytes", 16384, "--pages-per-erase-block", 4,
               "--op", 0.2, "--json", out, "--plot", png) == 0
    data = json.loads(out.read_text())
    assert data["waf"] == 1.0 and data["tier_blocks"] == 64 and data["host_page_writes"] == 320
    assert_png(png, min_bytes=1000)


@pytest.mark.parametrize("content, argv, message", [
    (None, [], "no such file"),
    ("[1, 2", [], "malformed JSON"),
    ("1\n-2\n", [], "non-negative integers"),
    ("1\nx\n", [], ":2: not an integer block id"),
    ("# nothing\n", [], "the trace is empty"),
    ('{"ids": [1]}', [], "no 'block_ids' key"),
    ("0\n1\n9\n", ["--tier-blocks", 4], "block id 9 >= tier_blocks 4"),
    ("0\n1\n", ["--block-bytes", 10000], "must be a multiple of page_bytes"),
    ("0\n1\n", [], "spare erase blocks"),
    ("0\n1\n", ["--save-trace", "x.txt"], "--save-trace needs --policy"),
    ("0\n123456789012\n", [], "exceed the simulator's"),
])
def test_cli_rejects_bad_traces(cli, tmp_path, capsys, content, argv, message):
    path = tmp_path / "trace.txt"
    if content is not None:
        path.write_text(content)
    assert cli("wafsim", "--trace", path, *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hifc wafsim: error:") and message in err


@pytest.mark.parametrize("argv, message", [
    ([], "one of the arguments --trace --policy is required"),
    (["--policy", "random"], "invalid choice"),
    (["--policy", "append", "--trace", "t.txt"], "not allowed with"),
    (["--policy", "append", "--fill", "1.5"], "must be in (0, 1]"),
    (["--policy", "append", "--churn", "-0.1"], "must be in [0, 1]"),
    (["--policy", "append", "--seq-blocks", "8", "4"], "min_seq_blocks <= max_seq_blocks"),
    (["--policy", "append", "--op", "-1"], "must be >= 0"),
])
def test_cli_rejects_bad_flags(cli, capsys, argv, message):
    assert cli("wafsim", *argv) == 2
    assert message in capsys.readouterr().err


def test_tier_allocator_export_matches_the_synthetic_generator(tmp_path):
    """The flash tier's allocator and our generator agree on both policies' block choice."""
    allocator_module = pytest.importorskip("hifc.tiers.allocator")
    workload = SwapWorkload(tier_blocks=512, swap_outs=300, churn=0.3, seed=3)
    for policy in ("append", "left-append"):
        allocator = allocator_module.FCBlockAllocator(workload.tier_blocks, policy)
        rng, resident = np.random.default_rng(workload.seed), []
        for _ in range(workload.swap_outs):   # the generator's loop, driving the real allocator
            size = int(rng.integers(workload.min_seq_blocks, workload.max_seq_blocks + 1))
            while sum(map(len, resident)) + size > workload.resident_limit:
                pick = int(rng.integers(len(resident))) if rng.random() < workload.churn else 0
                allocator.free(resident.pop(pick))
            blocks = allocator.allocate(size)
            allocator.mark_written(blocks)
            resident.append(blocks)
        path = tmp_path / f"{policy}.txt"
        allocator.export_trace(path)
        exported = load_trace(path)
        assert exported.tier_blocks == workload.tier_blocks
        assert exported.block_ids.tolist() == generate(workload, policy).block_ids.tolist()
