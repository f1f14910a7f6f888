"""The clock sampler of the benchmarks (hifc.bench.power): nvidia-smi's lines parsed and
summarised, a fake nvidia-smi on PATH standing in for the real one, nothing sampled off CUDA."""
import os
import stat
import time

import pytest
import torch

from hifc.bench import power


def test_lines_parse_into_a_summary_and_bad_lines_are_skipped():
    lines = ["1980, 410.5, 0x0000000000000000", "1455, 691.0, 0x0000000000000004",
             "1500, 693.2, 0x0000000000000004", "[N/A], 12.0, 0x0", "garbage", ""]
    samples = power.parse_samples(lines)
    assert samples == [(1980.0, 410.5, 0), (1455.0, 691.0, 4), (1500.0, 693.2, 4)]
    summary = power.summarize(samples)
    assert summary == {"samples": 3, "sm_mhz_min": 1455.0, "sm_mhz_median": 1500.0,
                       "sm_mhz_max": 1980.0, "power_w_median": 691.0,
                       "power_capped_fraction": pytest.approx(2 / 3)}
    assert "1500 MHz" in power.describe(summary) and "67%" in power.describe(summary)
    assert power.summarize([]) is None and power.describe(None) == ""


def test_the_device_is_named_as_cuda_visible_devices_names_it():
    assert power.visible_id(0, None) == "0" and power.visible_id(1, "") == "1"
    assert power.visible_id(1, "3, 5") == "5"
    assert power.visible_id(0, "GPU-8f2e,GPU-1a") == "GPU-8f2e"


def test_a_silent_nvidia_smi_does_not_hold_the_phase_up(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")  # one process, as nvidia-smi is
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(power, "smi_id", lambda device: "0")
    monkeypatch.setattr(power, "STARTUP_S", 0.1)
    with power.ClockSampler("cpu") as clocks:
        pass
    assert clocks.summary() is None


def test_nothing_is_sampled_off_cuda():
    with power.ClockSampler("cpu") as clocks:
        pass
    assert clocks.summary() is None


def test_samples_come_from_nvidia_smi_while_the_block_runs(tmp_path, monkeypatch):
    """A stand-in nvidia-smi that prints a line at once, then one per interval until stopped;
    the first (before the block) is left out."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    "echo \"$@\" > \"$(dirname \"$0\")/args\"\n"
                    "echo '1980, 120.0, 0x0'\n"
                    "while true; do echo '1470, 690.0, 0x4'; sleep 0.01; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(power, "smi_id", lambda device: "GPU-test")
    with power.ClockSampler(torch.device("cpu"), interval_ms=10) as clocks:
        time.sleep(0.2)  # the phase: the stand-in prints a line every 10 ms meanwhile
    summary = clocks.summary()
    assert summary["samples"] >= 1 and summary["sm_mhz_min"] == 1470.0
    assert summary["power_capped_fraction"] == 1.0
    args = (tmp_path / "args").read_text().split()
    assert "--id=GPU-test" in args and args[args.index("-lms") + 1] == "10"
