"""scripts/gpu_step_phases.py in its CPU smoke mode (SmolLM2): every step's host phases are
timed for JSON and free requests, and only JSON steps fill grammar masks."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_step_phases_on_cpu(tmp_path):
    pytest.importorskip("xgrammar")
    out = tmp_path / "phases.json"
    result = subprocess.run(
        [sys.executable, "scripts/gpu_step_phases.py", "--device", "cpu", "--requests", "2",
         "--max-tokens", "4", "--kv-cache-gib", "0.05", "--json", str(out)],
        cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())["results"]
    for kind in ("json", "free"):
        host, steps = report[kind]["host"], report[kind]["steps"]
        assert steps >= 4 and report[kind]["tokens"] > 0
        for phase in ("step", "schedule", "launch_forward", "launch_sampling", "constraints"):
            assert host[phase]["n"] == steps, (kind, phase)
        assert host["apply"]["n"] == host["update"]["n"] >= steps - 1
        assert report[kind]["device"] == {}  # no CUDA events on the CPU
    assert report["free"]["tokens"] == 2 * 4  # EOS ignored
    assert report["json"]["host"]["constraints"]["median_ms"] > \
        report["free"]["host"]["constraints"]["median_ms"]
