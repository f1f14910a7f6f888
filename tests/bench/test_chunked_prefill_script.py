"""scripts/gpu_chunked_prefill.py in its CPU smoke mode (tiny presets): the stall and alone parts
run, leave no block held, and report what the GPU runs are read for."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_stall_and_alone_parts_on_cpu(tmp_path):
    out = tmp_path / "chunked.json"
    result = subprocess.run(
        [sys.executable, "scripts/gpu_chunked_prefill.py", "--device", "cpu", "--parts",
         "stall,alone", "--modes", "off,64,256:32:4096", "--alone-rounds", "2", "--json",
         str(out)],
        cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    stall = report["stall"]
    assert [row["chunked_prefill"] for row in stall] == ["off", "on", "on"]
    assert stall[2]["long_prefill_token_threshold"] == 32
    assert stall[2]["prefill_attention_budget"] == 4096
    for row in stall:
        assert row["released"] and row["itl_samples"] > 0
        assert 0 < row["decode_step_median_ms"] and isinstance(row["decoders_outlast_prefill"],
                                                                bool)
        assert row["graphs"]["decode_graphs"] == 0  # no CUDA graphs on the CPU
    # one prefill step holds the long prompt when chunked prefill is off, several when on
    assert stall[0]["steps_while_prefilling"] == 1 < stall[1]["steps_while_prefilling"]
    alone = report["alone"]
    assert [row["mode"] for row in alone] == ["auto", "paged", "fused",
                                              "paged", "fused", "auto"]  # round 2 rotated
    assert all(row["released"] and row["ttft_s"] > 0 for row in alone)
    assert len({row["prompt_tokens"] for row in alone}) == 6  # a new length each time
