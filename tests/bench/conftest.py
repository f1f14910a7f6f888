"""Fixtures of the benchmark tests: one torch thread, tier options, in-process CLI, PNG check."""
import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def one_torch_thread():
    """A tiny model gains nothing from threads, and two cores shared with other test processes
    make torch's thread pool spin (a 100x slowdown seen): run these tests on one thread."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiers(tmp_path):
    """Tier options: 10 MiB of pinned DRAM and a 10 MiB flash cache file in tmp_path."""
    return ["--swap-space", "0.01", "--flash-size-gib", "0.01",
            "--flash-path", str(tmp_path / "tier.kv")]


@pytest.fixture
def hifc(capsys):
    """Run ``hifc <argv>`` in-process; returns (exit code, stdout, stderr). argparse errors
    raise SystemExit (code 2)."""
    from hifc.entrypoints.cli import main

    def run(*argv):
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run


@pytest.fixture
def assert_png():
    def check(path):
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
        assert len(data) > 5000, f"{path} is suspiciously small ({len(data)} bytes)"
    return check
