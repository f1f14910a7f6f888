"""The SM clock and power of a GPU while a benchmark phase runs, as ``nvidia-smi`` samples them.

An H200 holds its 1,980 MHz top clock only while it stays under its 700 W limit: a long prefill
or a decode batch of 128 rows runs at about 1,450-1,650 MHz (docs/RESULTS.md, "The H200's 700 W
limit"). A benchmark figure says more with the clock it ran at beside it, so ``bench kernels``
and ``bench throughput`` record ``ClockSampler.summary()`` for each timed phase.
"""
from __future__ import annotations

import os
import select
import shutil
import statistics
import subprocess

FIELDS = "clocks.sm,power.draw,clocks_throttle_reasons.active"
POWER_CAP = 0x4  # nvidia-smi's throttle reason bit "software power cap"
STARTUP_S = 5.0  # the longest wait for nvidia-smi's first line


def smi_id(device) -> str | None:
    """nvidia-smi's ``--id`` for a CUDA device, or None off CUDA."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return visible_id(index, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_id(index: int, visible: str | None) -> str:
    """The entry of CUDA_VISIBLE_DEVICES that CUDA's device ``index`` is (an index, a UUID or
    a MIG name, which nvidia-smi's ``--id`` takes as they are), or ``index`` without it (the
    same GPU where CUDA orders devices as nvidia-smi does: one GPU, or CUDA_DEVICE_ORDER=
    PCI_BUS_ID)."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    return entries[index] if index < len(entries) else str(index)


def parse_samples(lines: list[str]) -> list[tuple[float, float, int]]:
    """(SM MHz, watts, throttle reasons) of each well-formed line of FIELDS."""
    samples = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            samples.append((float(parts[0]), float(parts[1]), int(parts[2], 16)))
        except ValueError:  # "[N/A]" and the like
            continue
    return samples


def summarize(samples: list[tuple[float, float, int]]) -> dict | None:
    """SM clock min / median / max, median power and the share of samples under the power cap;
    None without samples."""
    if not samples:
        return None
    clocks = [s[0] for s in samples]
    return {"samples": len(samples), "sm_mhz_min": min(clocks),
            "sm_mhz_median": statistics.median(clocks), "sm_mhz_max": max(clocks),
            "power_w_median": statistics.median(s[1] for s in samples),
            "power_capped_fraction": sum(s[2] & POWER_CAP != 0 for s in samples) / len(samples)}


class ClockSampler:
    """``with ClockSampler(device) as clocks: <phase>``, then ``clocks.summary()``: nvidia-smi
    sampling the device every ``interval_ms`` while the block runs. Off CUDA, or without
    nvidia-smi, it samples nothing and the summary is None."""

    def __init__(self, device, interval_ms: int = 50):
        self.device, self.interval_ms = device, interval_ms
        self._proc: subprocess.Popen | None = None
        self._lines: list[str] = []

    def __enter__(self) -> ClockSampler:
        target, smi = smi_id(self.device), shutil.which("nvidia-smi")
        if target is not None and smi is not None:
            self._proc = subprocess.Popen(
                [smi, f"--id={target}", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits",
                 "-lms", str(self.interval_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            # sampling has begun (that first line is a sample from before the phase); an
            # nvidia-smi that says nothing for STARTUP_S seconds does not hold the benchmark up
            if select.select([self._proc.stdout], [], [], STARTUP_S)[0]:
                self._proc.stdout.readline()
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        self._lines = out.splitlines()

    def summary(self) -> dict | None:
        return summarize(parse_samples(self._lines))


def describe(clocks: dict | None) -> str:
    """One line for a benchmark's table ("" without a summary)."""
    if clocks is None:
        return ""
    return (f"SM {clocks['sm_mhz_median']:.0f} MHz (min {clocks['sm_mhz_min']:.0f}), "
            f"{clocks['power_w_median']:.0f} W, power-capped in "
            f"{100 * clocks['power_capped_fraction']:.0f}% of {clocks['samples']} samples")
