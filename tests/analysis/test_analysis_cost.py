import json

import pytest

from hifc.analysis.cost import PRESETS, MemoryOption, compare, option_cost


def test_cost_formula_matches_hand_computation():
    cost = option_cost(MemoryOption("x", capacity_gib=100, usd_per_gib=2.0, power_w=10,
                                    years=2, pue=1.2, usd_per_kwh=0.2))
    assert cost.capex_usd == pytest.approx(200.0)
    # 10 W x 8760 h x 2 y x 1.2 PUE / 1000 = 210.24 kWh at $0.20
    assert cost.energy_kwh == pytest.approx(210.24)
    assert cost.opex_usd == pytest.approx(42.048)
    assert cost.total_usd == pytest.approx(242.048)


def test_presets_land_on_the_paper_2025h2_totals():
    dram, ssd = compare([PRESETS["dram"], PRESETS["hifc-ssd"]])
    assert dram.capex_usd == pytest.approx(128 * 5.06)
    assert ssd.capex_usd == pytest.approx(1024 * 0.10)
    assert dram.opex_usd == pytest.approx(13.75 * 8760 * 3 * 1.5 * 0.15 / 1000)
    assert round(dram.total_usd) == 729
    assert round(ssd.total_usd) == 120
    assert round(dram.total_usd / ssd.total_usd, 1) == 6.1


def test_option_validation():
    with pytest.raises(ValueError, match="capacity_gib"):
        MemoryOption("x", capacity_gib=0, usd_per_gib=1, power_w=1)
    with pytest.raises(ValueError, match="power_w"):
        MemoryOption("x", capacity_gib=1, usd_per_gib=1, power_w=-1)


def test_cli_writes_table_json_and_plot(cli, tmp_path, capsys, assert_png):
    out, png = tmp_path / "cost.json", tmp_path / "cost.png"
    assert cli("cost", "--json", out, "--plot", png) == 0
    table = capsys.readouterr().out
    assert "dram" in table and "hifc-ssd" in table and "6.07x" in table
    data = json.loads(out.read_text())
    assert data["order"] == ["dram", "hifc-ssd"] and data["cheapest"] == "hifc-ssd"
    for name in ("dram", "hifc-ssd"):
        entry = data["options"][name]
        assert entry["total_usd"] == pytest.approx(entry["capex_usd"] + entry["opex_usd"])
    assert data["options"]["dram"]["total_vs_cheapest"] == pytest.approx(6.0678, abs=1e-3)
    assert_png(png, min_bytes=1000)


def test_cli_overrides_broadcast_or_per_preset(cli, tmp_path):
    out = tmp_path / "cost.json"
    assert cli("cost", "--preset", "dram", "hifc-ssd", "smartssd", "--years", "5",
               "--power-w", "10", "2", "12", "--usd-per-kwh", "0", "--json", out) == 0
    options = json.loads(out.read_text())["options"]
    assert [options[n]["years"] for n in ("dram", "hifc-ssd", "smartssd")] == [5, 5, 5]
    assert options["hifc-ssd"]["power_w"] == 2
    assert options["dram"]["opex_usd"] == 0
    assert options["smartssd"]["capex_usd"] == pytest.approx(2526)


def test_cli_duplicate_presets_get_distinct_names(cli, tmp_path):
    out = tmp_path / "cost.json"
    assert cli("cost", "--preset", "hifc-ssd", "hifc-ssd", "--capacity-gib", "1024", "2048",
               "--json", out) == 0
    data = json.loads(out.read_text())
    assert data["order"] == ["hifc-ssd", "hifc-ssd-2"]
    assert data["options"]["hifc-ssd-2"]["capex_usd"] == pytest.approx(204.8)


@pytest.mark.parametrize("argv, message", [
    (["--years", "0"], "--years: must be > 0"),
    (["--capacity-gib", "-5"], "--capacity-gib: must be > 0"),
    (["--pue", "abc"], "not a number"),
    (["--preset", "tape"], "invalid choice"),
    (["--power-w", "1", "2", "3"], "--power-w takes 1 value or one per --preset (2), got 3"),
])
def test_cli_rejects_bad_input(cli, capsys, argv, message):
    assert cli("cost", *argv) == 2
    assert message in capsys.readouterr().err


def test_cli_unwritable_output(cli, tmp_path, capsys):
    assert cli("cost", "--json", tmp_path / "missing" / "out.json") == 2
    assert "cannot write" in capsys.readouterr().err
