"""``hifc bench prefix`` on tiny settings: every variant of both workloads, the JSON, the PNG;
the conversation workloads; bad input."""
import json

import pytest

from hifc.bench.conversations import Caps, multi_turn, system_prompt
from hifc.bench.workloads import TokenLengths

TINY = ("--model", "random:tiny-llama", "--device", "cpu", "--dtype", "float32",
        "--block-size", "16", "--num-gpu-blocks", "24", "--max-model-len", "384",
        "--num-conversations", "3", "--max-turns", "3", "--max-turn-tokens", "40",
        "--max-output-tokens", "4", "--num-requests", "4", "--system-prompt-len", "64",
        "--max-concurrency", "2", "--sharegpt-max-records", "100")


def test_every_variant_of_both_workloads(hifc, tiers, tmp_path):
    out, png = tmp_path / "prefix.json", tmp_path / "prefix.png"
    code, stdout, _ = hifc("bench", "prefix", *TINY, *tiers, "--prefix-store-read", "always",
                           "--json", out, "--plot", png)
    assert code == 0, stdout
    summary = json.loads(out.read_text())
    assert summary["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # layers, K/V, heads, dim, fp32
    assert list(summary["results"]) == ["multi-turn", "system-prompt"]
    for workload, result in summary["results"].items():
        rows = {r["variant"]: r for r in result["variants"]}
        assert list(rows) == ["none", "gpu", "flash", "flash-restart"]
        requests = result["workload"]["requests"]
        for r in rows.values():
            assert r["requests"] == requests and r["ttft_p50_s"] <= r["ttft_p99_s"]
            assert r["output_tokens_per_s"] > 0
        assert rows["none"]["prefix_cache_hits"] == 0 and rows["gpu"]["prefix_cache_hits"] > 0
        assert rows["none"]["ttft_p50_x_none"] == 1.0
        assert all(r["outputs_match_none"] for r in rows.values())  # greedy parity
        restart = rows["flash-restart"]
        # the warm file: the first turns (the system prompt) come from flash, read (always)
        assert restart["prefix_store_hits"] > 0 and restart["prefix_store_recomputed"] == 0
        assert restart["prefix_store_read_tokens"] == restart["prefix_store_hits"]
        assert restart["prefix_store_bytes_read"] > 0 and restart["tier_read_bytes_per_s"] > 0
    assert "flash-restart" in stdout and "TTFT p50 s" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra,message", [
    (("--variants", "flash-restart"), "list both"),
    (("--variants", "gpu,nope"), "--variants must be distinct names"),
    (("--workloads", "chat"), "--workloads must be distinct names"),
    (("--max-concurrency", "0"), "--max-concurrency must be positive"),
])
def test_bad_input_is_a_clear_error(hifc, tiers, extra, message):
    code, _, err = hifc("bench", "prefix", *TINY, *tiers, *extra)
    assert code == 2 and message in err


def test_a_budget_is_required(hifc, tiers):
    argv = [a for a in TINY if a not in ("--num-gpu-blocks", "24")]
    code, _, err = hifc("bench", "prefix", *argv, *tiers)
    assert code == 2 and "KV budget" in err


LENGTHS = TokenLengths("words", lambda text: len(text.split()), None)
EXCHANGES = [[("a b c", "d e"), ("f g h i", "j k l")], [("one", "two")],
             [("x " * 50, "y " * 10), ("z", "w")]]


def test_multi_turn_conversations_keep_two_turns_within_the_caps():
    dialogues = multi_turn(EXCHANGES, 2, LENGTHS, Caps(4, 8, 3, 64), 100, seed=0)
    assert len(dialogues) == 2 and all(len(d.turns) == 2 for d in dialogues)
    for d in dialogues:
        assert all(len(t.user_ids) <= 8 and t.output_tokens <= 3 for t in d.turns)
    with pytest.raises(ValueError, match="only 2 ShareGPT conversations have two turns"):
        multi_turn(EXCHANGES, 3, LENGTHS, Caps(4, 8, 3, 64), 100, seed=0)


def test_system_prompt_requests_share_their_prefix():
    requests = system_prompt(EXCHANGES, 5, 20, LENGTHS, Caps(1, 8, 3, 64), 100, seed=0)
    prompts = [r.turns[0].user_ids for r in requests]
    assert len(prompts) == 5 and all(p[:20] == prompts[0][:20] for p in prompts)
    with pytest.raises(ValueError, match="leaves no room"):
        system_prompt(EXCHANGES, 5, 64, LENGTHS, Caps(1, 8, 3, 64), 100, seed=0)
