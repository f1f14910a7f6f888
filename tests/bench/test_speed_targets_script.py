"""scripts/gpu_speed_targets.sh: shell syntax, stage checks, two stages' CPU analogues and the
summary's verdicts."""
import json
import shutil

import pytest

from tests.bench.helpers import ROOT, parses, run_bash

SCRIPT = ROOT / "scripts" / "gpu_speed_targets.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run_script(*argv, timeout=180):
    return run_bash(SCRIPT, *argv, env={"HIFC_SMOKE": "1"}, timeout=timeout)


def test_script_parses():
    assert parses(SCRIPT)


def test_unknown_stage_is_refused_before_anything_runs(tmp_path):
    result = run_script(tmp_path / "out", "decode-64b")
    assert result.returncode == 2
    assert "unknown stage 'decode-64b'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_stages_on_cpu_write_their_figures_and_the_summary(tmp_path):
    out = tmp_path / "out"
    result = run_script(out, "decode-8b", "e2e")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "=== decode-8b ok" in result.stdout and "=== e2e ok" in result.stdout
    kernels = json.loads((out / "decode-8b.json").read_text())
    assert [row["batch"] for row in kernels["decode"]] == [1, 32, 128]
    assert kernels["prefill"]["tokens"] == 128
    assert json.loads((out / "e2e.json").read_text())["workload"]["num_prompts"] == 4
    lines = result.stdout.splitlines()
    for batch, target in ((1, "<= 1.15"), (32, "<= 1.10"), (128, "<= 1.10")):
        assert any(f"tiny-llama decode, batch {batch}, from 64 keys" in line
                   and f"target {target}" in line for line in lines)
    assert any("tiny-llama prefill, 128 tokens" in line and ">= 0.78" in line for line in lines)
    assert any(line.startswith("end to end, 4 x 32 in, 8 out") and ">= 0.85" in line
               for line in lines)
    assert (out / "e2e.log").stat().st_size > 0


def test_the_summary_reads_every_stage_written_and_judges_each_figure(tmp_path):
    # figures a GPU run left (one met, one not) beside a stage run now
    out = tmp_path / "out"
    out.mkdir()
    row = dict(context=4096, step_ms=8.4)
    (out / "decode-32b.json").write_text(json.dumps({
        "model": "random:ds-r1-qwen-32b",
        "decode": [dict(row, batch=1, step_over_floor=1.16),
                   dict(row, batch=32, step_over_floor=1.09),
                   dict(row, batch=4, step_over_floor=1.5),  # no target at batch 4
                   dict(batch=128, context=4096, skipped="needs 8717 KV blocks")]}))
    (out / "prefill-32k.json").write_text(json.dumps({
        "model": "random:ds-r1-llama-8b", "decode": [],
        "prefill": dict(tokens=32768, fraction_of_matmul=0.76, fraction_of_sustained=0.92)}))
    result = run_script(out, "govreport")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "target" in line]
    assert any(line.startswith("ds-r1-qwen-32b decode, batch 1,") and line.endswith("NOT met")
               for line in lines)
    assert any(line.startswith("ds-r1-qwen-32b decode, batch 32,") and line.endswith(" met")
               and not line.endswith("NOT met") for line in lines)
    assert not any("batch 4," in line for line in lines)
    assert any(line.startswith("ds-r1-qwen-32b decode, batch 128,") and "needs 8717" in line
               and line.endswith("not run") for line in lines)
    assert any(line.startswith("ds-r1-llama-8b prefill, 32768 tokens") and ">= 0.75" in line
               and not line.endswith("NOT met") for line in lines)
    assert any(line.startswith("end to end, govreport-like, 2 prompts") for line in lines)
