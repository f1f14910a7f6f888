"""scripts/cpu_host_costs.py at a small size: every phase is timed at every step, the texts get a
digest (the same when the engine is stepped for deltas, as a server steps it), and the packing
table covers its shapes."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, *extra: str) -> dict:
    result = subprocess.run(
        [sys.executable, "scripts/cpu_host_costs.py", "--batch-sizes", "3", "--max-tokens", "4",
         "--repeats", "1", "--json", str(out), *extra],
        cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())


def test_host_costs_script(tmp_path):
    report = _run(tmp_path / "final.json")
    phases = report["phases"]["3"]
    assert set(phases["median_ms"]) == set(phases["mean_ms"]) == {
        "schedule", "update", "scheduler.update", "launch_sampling", "step"}
    assert phases["chars"] > 0 and len(phases["texts"]) == 12
    assert [(p["rows"], p["context"]) for p in report["packing"]] == \
        [(64, 1024), (256, 1024), (64, 8192), (128, 4096)]
    assert all(p["whole_ms"] > 0 and p["kept_ms"] > 0 for p in report["packing"])
    streamed = _run(tmp_path / "delta.json", "--output-kind", "delta", "--no-packing")
    assert streamed["phases"]["3"]["texts"] == phases["texts"] and not streamed["packing"]
