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


@pytest.mark.parametrize("layout", ["block-record", "layer-kv"])
def test_bench_io_tiny(tmp_path, capsys, layout):
    out = tmp_path / "io.json"
    path = tmp_path / "bench.kvc"
    args = parse("io", "--path", str(path), "--size-gib", "0.005", "--json", str(out),
                 "--threads", "2", "--chunk-mib", "1", "--batch-blocks", "8", "--layout", layout,
                 *TINY)
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    for key in ("seq_write_gibps", "seq_read_gibps", "rand_write_gibps", "rand_read_gibps",
                "raw_seq_write_gibps", "raw_seq_read_gibps"):
        assert result[key] > 0
    assert result["verified_bit_exact"] is True and result["layout"] == layout
    assert isinstance(result["direct_io"], bool) and isinstance(result["raw_direct_io"], bool)
    text = capsys.readouterr().out
    assert "tier/raw" in text and "O_DIRECT" in text
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
    args = parse("io", "--path", str(existing), "--size-gib", "0.01", *TINY)
    with pytest.raises(ValueError, match="not an hifc cache file"):
        args.func(args)
    assert existing.read_text() == "x"
