"""``hifc bench parallel`` on the CPU: one replica against two sharing a flash directory without
the arbiter; the table, the JSON and its ratios (no timing asserted)."""
import json

import pytest

pytestmark = pytest.mark.slow  # the dp2 variant starts two replica processes

TINY = ["--model", "random:tiny-llama", "--device", "cpu", "--input-len", "48", "--output-len",
        "40", "--num-prompts", "5", "--block-size", "16", "--num-gpu-blocks", "12"]


def test_one_gpu_against_two_replicas_on_one_disk(hifc, tmp_path):
    out = tmp_path / "table2.json"
    code, stdout, _ = hifc("bench", "parallel", *TINY, "--flash-size-gib", "0.01",
                           "--flash-path", str(tmp_path / "kv-{replica}.hifc"),
                           "--variants", "dp1-flash,dp2-flash", "--json", out,
                           "--no-progress")
    assert code == 0
    summary = json.loads(out.read_text())
    one, two = summary["variants"]
    assert (one["variant"], one["replicas"], one["flash_disks"]) == ("dp1-flash", 1, 1)
    assert (two["variant"], two["replicas"], two["flash_disks"]) == ("dp2-flash", 2, 1)
    assert one["requests"] == 5 and two["requests"] == 10  # --num-prompts per replica
    assert [p["generation_tokens"] for p in two["per_replica"]] == [5 * 40, 5 * 40]
    assert two["ratio_to_one_gpu"] == pytest.approx(
        two["output_tokens_per_s"] / one["output_tokens_per_s"])
    assert two["flash_to_dram_per_gpu"] is None  # no dram variant ran
    assert two["flash_devices"] == [] and not two["arbiter"]  # one disk, arbiter off
    assert all(p["swap_out_blocks"] > 0 for p in two["per_replica"])
    assert two["swap_failures"] == 0
    assert "dp2-flash   2:1" in stdout


@pytest.mark.parametrize("variants,message", [
    ("dp1-flash-arbiter", "an arbiter shares a device among replicas"),
    ("dp2-ssd", "unknown variant"), ("dp1-dram,dp1-dram", "distinct variants")])
def test_bad_variants_are_refused(hifc, tmp_path, variants, message):
    code, _, err = hifc("bench", "parallel", *TINY, "--swap-space", "0.01", "--flash-size-gib",
                        "0.01", "--flash-path", str(tmp_path / "kv-{replica}.hifc"),
                        "--variants", variants)
    assert code == 2 and message in err
