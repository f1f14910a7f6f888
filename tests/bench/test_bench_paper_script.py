"""scripts/gpu_paper_run.sh: shell syntax, stage checks, and one stage's CPU analogue."""
import json
import shutil

import pytest

from tests.bench.helpers import ROOT, parses, run_bash

SCRIPT = ROOT / "scripts" / "gpu_paper_run.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run_script(*argv, smoke=True, timeout=120, flash_dir=None):
    env = {"HIFC_SMOKE": "1" if smoke else "0"}
    if flash_dir is not None:
        env["HIFC_FLASH_DIR"] = str(flash_dir)
    return run_bash(SCRIPT, *argv, env=env, timeout=timeout)


def test_script_parses():
    assert parses(SCRIPT)


def test_unknown_stage_is_refused_before_anything_runs(tmp_path):
    result = run_script(tmp_path / "out", "fig9")
    assert result.returncode == 2
    assert "unknown stage 'fig9'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_outdir_prints_usage():
    result = run_script()
    assert result.returncode != 0 and "usage" in result.stderr


def test_fig6_stage_on_cpu_writes_json_png_and_log(tmp_path):
    out, flash_dir = tmp_path / "out", tmp_path / "flash"
    flash_dir.mkdir()
    result = run_script(out, "fig6", flash_dir=flash_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "=== fig6 ok" in result.stdout
    sweep = json.loads((out / "fig6_block_size.json").read_text())
    assert sweep["figure"] == "block-size"
    assert [p["block_size"] for p in sweep["points"]] == [16, 32]
    assert (out / "fig6_block_size.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "fig6.log").stat().st_size > 0
    # the flash cache file went to HIFC_FLASH_DIR (the sweep records its path), and is removed
    assert f'"{flash_dir}/hifc-paper-' in (out / "fig6_block_size.json").read_text()
    assert not list(flash_dir.iterdir())
    assert not list(ROOT.glob("hifc-paper-*.kv"))
