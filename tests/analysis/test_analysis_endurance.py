import json

import pytest

from hifc.analysis.endurance import (
    EnduranceInput, daily_write_tib_from_rate, evaluate, lifetime_years, tbw_tib,
)


def test_tbw_is_exact_binary_arithmetic():
    # 30,000 P/E x 200 GiB = 6,000,000 GiB = 5,859.375 TiB (the paper rounds to 6,000 TiB)
    assert tbw_tib(30000, 200) == 5859.375
    res = evaluate(EnduranceInput(daily_write_tib=1.98))
    assert res.tbw_gib == 6_000_000
    assert res.tbw_tib == 5859.375


def test_lifetime_from_daily_writes():
    assert lifetime_years(5859.375, 1.98) == pytest.approx(5859.375 / (1.98 * 365))
    assert lifetime_years(5859.375, 1.98) == pytest.approx(8.1076, abs=1e-4)
    # the paper's ~8.3 years comes from the rounded 6,000 TiB
    assert round(lifetime_years(6000, 1.98), 1) == 8.3
    res = evaluate(EnduranceInput(daily_write_tib=1.98, tbw_tib=6000))
    assert res.lifetime_years == pytest.approx(6000 / (1.98 * 365))


def test_waf_shortens_lifetime():
    base = evaluate(EnduranceInput(daily_write_tib=2.0))
    amplified = evaluate(EnduranceInput(daily_write_tib=2.0, waf=2.0))
    assert amplified.lifetime_years == pytest.approx(base.lifetime_years / 2)
    assert amplified.nand_write_tib_per_day == 4.0


def test_daily_writes_extrapolated_from_a_run():
    one_tib = 1 << 40
    assert daily_write_tib_from_rate(one_tib, 3600) == pytest.approx(24.0)
    assert daily_write_tib_from_rate(one_tib, 3600, duty_cycle=0.5) == pytest.approx(12.0)


def test_cli_flags_to_json(cli, tmp_path, capsys):
    out = tmp_path / "e.json"
    assert cli("endurance", "--daily-write-tib", "1.98", "--json", out) == 0
    assert "8.11 years" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["tbw_tib"] == 5859.375
    assert data["lifetime_years"] == pytest.approx(5859.375 / (1.98 * 365))
    assert data["source"] == "flag"


def test_cli_from_bench(cli, tmp_path):
    bench, out = tmp_path / "bench.json", tmp_path / "e.json"
    bench.write_text(json.dumps({"tier_bytes_written": 1 << 40, "elapsed_s": 7200,
                                 "tokens_per_s": 123.0}))
    assert cli("endurance", "--from-bench", bench, "--duty-cycle", "0.5",
               "--pe-cycles", "3000", "--region-gib", "1024", "--json", out) == 0
    data = json.loads(out.read_text())
    assert data["daily_write_tib"] == pytest.approx(6.0)
    assert data["tbw_tib"] == 3000
    assert data["lifetime_years"] == pytest.approx(3000 / (6.0 * 365))


@pytest.mark.parametrize("payload, message", [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"elapsed_s": 10}', "missing key 'tier_bytes_written'"),
    ('{"tier_bytes_written": 100, "elapsed_s": 0}', "'elapsed_s' must be > 0"),
    ('{"tier_bytes_written": "lots", "elapsed_s": 5}', "must be a finite number"),
    ('{"tier_bytes_written": 0, "elapsed_s": 5}', "never swapped"),
])
def test_cli_rejects_bad_bench(cli, tmp_path, capsys, payload, message):
    bench = tmp_path / "bench.json"
    bench.write_text(payload)
    assert cli("endurance", "--from-bench", bench) == 2
    err = capsys.readouterr().err
    assert err.startswith("hifc endurance: error:") and message in err


@pytest.mark.parametrize("argv, message", [
    ([], "one of the arguments --daily-write-tib --from-bench is required"),
    (["--daily-write-tib", "1", "--from-bench", "x.json"], "not allowed with"),
    (["--daily-write-tib", "0"], "must be > 0"),
    (["--daily-write-tib", "1", "--pe-cycles", "-3"], "must be > 0"),
    (["--daily-write-tib", "1", "--duty-cycle", "0.5"], "--duty-cycle applies only"),
    (["--daily-write-tib", "1", "--waf", "0.5"], "--waf must be >= 1"),
    (["--from-bench", "/nonexistent/bench.json"], "no such file"),
])
def test_cli_rejects_bad_flags(cli, capsys, argv, message):
    assert cli("endurance", *argv) == 2
    assert message in capsys.readouterr().err
