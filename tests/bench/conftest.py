"""Fixtures of the benchmark tests: one torch thread, tier options, in-process CLI, argparse
rejection check (the PNG check is in tests/conftest.py)."""
import pytest


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
def argparse_rejects(hifc):
    """Check that ``hifc <argv>`` fails in argparse itself: SystemExit with code 2."""
    def check(*argv):
        with pytest.raises(SystemExit) as exc:
            hifc(*argv)
        assert exc.value.code == 2
    return check
