"""``hifc bench io`` and ``hifc bench init`` through their argparse registrars, at tiny sizes."""
import argparse
import json
import os

import pytest

from hifc.bench import init as bench_init
from hifc.bench import io as bench_io

TINY = ["--layers", "2", "--kv-heads", "2", "--head-dim", "64", "--block-size", "16",
        "--device", "cpu"]


def parse(*argv):
    parser = argparse.ArgumentParser(prog="hifc bench")
    sub = parser.add_subparsers(dest="bench_command", required=True)
    bench_io.register(sub)
    bench_init.register(sub)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("layout,extra", [
    pytest.param("block-record", [], id="block-record"),
    pytest.param("layer-kv", [], id="layer-kv"),
    pytest.param("block-record", ["--no-direct"], id="buffered")])
def test_bench_io_tiny(tmp_path, capsys, layout, extra):
    out = tmp_path / "io.json"
    path = tmp_path / "bench.kvc"
    args = parse("io", "--path", str(path), "--size-gib", "0.005", "--json", str(out),
                 "--threads", "2", "--chunk-mib", "1", "--batch-blocks", "8", "--layout", layout,
                 "--repeats", "2", *extra, *TINY)
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    for key in ("seq_write_gibps", "seq_read_gibps", "rand_write_gibps", "rand_read_gibps",
                "raw_seq_write_gibps", "raw_seq_read_gibps", "first_write_gibps"):
        assert result[key] > 0
    for op in ("write", "read"):
        low, mid, high = (result[f"seq_{op}_ratio{s}"] for s in ("_min", "", "_max"))
        assert all(isinstance(x, float) and x > 0 for x in (low, mid, high))
        assert low <= mid <= high
        assert isinstance(result[f"seq_{op}_pass"], bool)
    assert result["repeats"] == 2 and result["target_ratio"] == 0.95
    reps = result["per_repeat"]
    assert [r["repeat"] for r in reps] == [1, 2]
    # ABBA: raw goes first in odd repeats, the tier in even ones
    assert reps[0]["order"][:2] == ["raw_seq_write", "tier_seq_write"]
    assert reps[1]["order"][:2] == ["tier_seq_write", "raw_seq_write"]
    for rep in reps:
        assert rep["seq_write_ratio"] > 0 and rep["seq_read_ratio"] > 0
        assert rep["verified_bit_exact"] is True
    # both sides issue the same I/O: same sizes, same count, same thread count
    tier_io, raw_io = result["tier_io"], result["raw_io"]
    for key in ("ios", "bytes", "io_bytes_min", "io_bytes_max", "threads"):
        assert tier_io[key] == raw_io[key]
    assert result["tier_disk_bytes"] == result["raw_bytes"] == tier_io["bytes"]
    assert result["verified_bit_exact"] is True and result["layout"] == layout
    assert isinstance(result["direct_io"], bool) and isinstance(result["raw_direct_io"], bool)
    if extra:  # --no-direct: buffered on both sides, and said so
        assert result["direct_io"] is False and result["raw_direct_io"] is False
    text = capsys.readouterr().out
    assert "tier/raw" in text and "O_DIRECT" in text and "page cache:" in text
    lines = text.strip().splitlines()
    assert lines[-2].startswith("seq write tier/raw: median")
    assert lines[-1].startswith("seq read  tier/raw: median")
    assert all(line.rstrip().endswith(("PASS (>= 0.95)", "FAIL (>= 0.95)")) for line in lines[-2:])
    assert not path.exists()  # the run created it, so it removed it


def test_bench_init_tiny(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "init.json"
    args = parse("init", "--size-gib", "0.01", "--json", str(out), "--repeat", "2", *TINY)
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["reopen_reused_file"] and result["epochs_distinct"]
    for key in ("flash_create_s", "flash_reopen_s", "dram_alloc_s"):
        assert result[key] > 0
    assert "dram / flash reopen" in capsys.readouterr().out
    assert os.listdir(tmp_path) == ["init.json"]  # the temporary cache file is gone


def test_bench_init_prefix_scan_tiny(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "init.json"
    args = parse("init", "--size-gib", "0.01", "--json", str(out), "--repeat", "2",
                 "--skip-dram", "--prefix-scan", *TINY)
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["prefix_records"] == result["prefix_scan_records"] == result["num_blocks"]
    for key in ("prefix_fill_s", "prefix_scan_s", "prefix_scan_s_per_gib", "prefix_reopen_s",
                "prefix_scan_empty_s"):
        assert result[key] > 0
    assert len(result["prefix_scan_all_s"]) == 2
    assert "index rebuild" in capsys.readouterr().out
    assert os.listdir(tmp_path) == ["init.json"]


def test_bench_bad_input(tmp_path):
    existing = tmp_path / "exists"
    existing.write_text("x")
    args = parse("init", "--size-gib", "0.01", "--path", str(existing), *TINY)
    with pytest.raises(ValueError, match="exists"):
        args.func(args)
    args = parse("io", "--path", str(tmp_path / "b.kvc"), "--size-gib", "0.01",
                 "--batch-blocks", "0", *TINY)
    with pytest.raises(ValueError, match="batch-blocks"):
        args.func(args)
    assert not (tmp_path / "b.kvc").exists()
    args = parse("io", "--path", str(tmp_path / "b.kvc"), "--size-gib", "0.01",
                 "--repeats", "0", *TINY)
    with pytest.raises(ValueError, match="repeats"):
        args.func(args)
    args = parse("io", "--path", str(tmp_path / "b.kvc"), "--size-gib", "0.00003", *TINY)
    with pytest.raises(ValueError, match="at least 2"):
        args.func(args)
    assert not (tmp_path / "b.kvc").exists()
    args = parse("io", "--path", str(existing), "--size-gib", "0.01", *TINY)
    with pytest.raises(ValueError, match="not an hifc cache file"):
        args.func(args)
    assert existing.read_text() == "x"
