"""`hifc cost`: memory-expansion total cost of ownership (HIFC.md, "Models of cost").

    CapEx      = capacity_gib x usd_per_gib
    OpEx       = power_w x 24 x 365 x years x pue x usd_per_kwh / 1000
    MemExpCost = CapEx + OpEx

Where the preset inputs come from:
  from the paper (2025H2 update)  DRAM 128 GiB at $5.06/GiB; HiFC Gen4 pSLC SSD 1024 GiB at
                                  $0.10/GiB; 3 years; totals of about $729 (DRAM) and $120 (SSD);
                                  a used 4 TB SmartSSD at about $2,526.
  our assumptions                 PUE 1.5 and $0.15/kWh (a typical data-centre PUE and a
                                  commercial electricity price); average power 13.75 W for
                                  128 GiB of server DRAM (4 x 32 GiB DDR5 RDIMM at ~3.4 W each)
                                  and 3.0 W for the Gen4 SSD (idle ~1.5 W, ~6-7 W while writing,
                                  at a swap duty cycle). These two power figures were chosen so
                                  the 3-year totals land on the paper's: $728.98 and $120.14.
                                  SmartSSD: 4 TB = 3725.3 GiB, 12 W average (FPGA + NAND).
With these inputs DRAM costs 6.07x the SSD in total (paper: 6.1x), 6.3x the CapEx and 4.6x the
power; the paper's 12.8x power ratio belongs to its earlier figures and cannot hold together with
the 2025H2 totals at one PUE and energy price.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from hifc.analysis.common import (
    EXIT_OK, InputError, new_figure, non_negative_float, positive_float, run_guarded,
    save_figure, write_json,
)

HOURS_PER_YEAR = 24 * 365


@dataclass(frozen=True)
class MemoryOption:
    """One way to add KV capacity, with everything its 3-year cost depends on."""
    name: str
    capacity_gib: float
    usd_per_gib: float
    power_w: float
    years: float = 3.0
    pue: float = 1.5
    usd_per_kwh: float = 0.15

    def __post_init__(self) -> None:
        for field in ("capacity_gib", "years", "pue"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be > 0, got {getattr(self, field)}")
        for field in ("usd_per_gib", "power_w", "usd_per_kwh"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)}")


@dataclass(frozen=True)
class OptionCost:
    option: MemoryOption
    capex_usd: float
    energy_kwh: float   # at the wall, PUE included
    opex_usd: float
    total_usd: float


PRESETS: dict[str, MemoryOption] = {
    "dram": MemoryOption("dram", capacity_gib=128, usd_per_gib=5.06, power_w=13.75),
    "hifc-ssd": MemoryOption("hifc-ssd", capacity_gib=1024, usd_per_gib=0.10, power_w=3.0),
    "smartssd": MemoryOption("smartssd", capacity_gib=4e12 / (1 << 30),
                             usd_per_gib=2526 / (4e12 / (1 << 30)), power_w=12.0),
}
DEFAULT_PRESETS = ("dram", "hifc-ssd")


def option_cost(option: MemoryOption) -> OptionCost:
    capex = option.capacity_gib * option.usd_per_gib
    energy_kwh = option.power_w * HOURS_PER_YEAR * option.years * option.pue / 1000
    opex = energy_kwh * option.usd_per_kwh
    return OptionCost(option, capex, energy_kwh, opex, capex + opex)


def compare(options: list[MemoryOption]) -> list[OptionCost]:
    if not options:
        raise ValueError("no options to compare")
    return [option_cost(option) for option in options]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def to_json(costs: list[OptionCost]) -> dict:
    cheapest = min(cost.total_usd for cost in costs)
    options = {}
    for cost in costs:
        entry = dataclasses.asdict(cost.option)
        del entry["name"]
        entry.update(capex_usd=cost.capex_usd, energy_kwh=cost.energy_kwh,
                     opex_usd=cost.opex_usd, total_usd=cost.total_usd,
                     usd_per_gib_total=cost.total_usd / cost.option.capacity_gib,
                     total_vs_cheapest=_ratio(cost.total_usd, cheapest))
        options[cost.option.name] = entry
    return {"options": options, "order": [cost.option.name for cost in costs],
            "cheapest": min(costs, key=lambda c: c.total_usd).option.name}


def format_table(costs: list[OptionCost]) -> str:
    cheapest = min(cost.total_usd for cost in costs)
    header = (f"{'option':<12}{'GiB':>8}{'$/GiB':>8}{'W':>7}{'years':>6}{'PUE':>5}"
              f"{'$/kWh':>7}{'capex $':>10}{'opex $':>9}{'total $':>10}{'x cheapest':>12}")
    lines = [header, "-" * len(header)]
    for c in costs:
        o = c.option
        ratio = _ratio(c.total_usd, cheapest)
        lines.append(f"{o.name:<12}{o.capacity_gib:>8.0f}{o.usd_per_gib:>8.2f}{o.power_w:>7.2f}"
                     f"{o.years:>6g}{o.pue:>5g}{o.usd_per_kwh:>7.3f}{c.capex_usd:>10.2f}"
                     f"{c.opex_usd:>9.2f}{c.total_usd:>10.2f}"
                     f"{(f'{ratio:.2f}x' if ratio is not None else 'n/a'):>12}")
    if len(costs) >= 2:
        a, b = costs[0], costs[1]
        parts = [f"{a.option.name} vs {b.option.name}:"]
        for label, num, den in (("total", a.total_usd, b.total_usd),
                                ("capex", a.capex_usd, b.capex_usd),
                                ("power", a.option.power_w, b.option.power_w)):
            ratio = _ratio(num, den)
            parts.append(f"{label} {ratio:.2f}x" if ratio is not None else f"{label} n/a")
        lines.append(" ".join(parts[:1]) + " " + ", ".join(parts[1:]))
    return "\n".join(lines)


def plot(costs: list[OptionCost], path: str) -> None:
    fig = new_figure()
    ax = fig.add_subplot()
    names = [c.option.name for c in costs]
    capex = [c.capex_usd for c in costs]
    opex = [c.opex_usd for c in costs]
    ax.bar(names, capex, label="CapEx")
    ax.bar(names, opex, bottom=capex, label="OpEx (energy)")
    for i, c in enumerate(costs):
        ax.annotate(f"${c.total_usd:,.0f}", (i, c.total_usd), ha="center", va="bottom")
    years = sorted({c.option.years for c in costs})
    ax.set_ylabel("USD")
    ax.set_title(f"Memory-expansion cost over {'/'.join(f'{y:g}' for y in years)} years")
    ax.legend()
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------- CLI

_OVERRIDES = (  # flag, MemoryOption field, argparse type
    ("--capacity-gib", "capacity_gib", positive_float),
    ("--usd-per-gib", "usd_per_gib", non_negative_float),
    ("--power-w", "power_w", non_negative_float),
    ("--years", "years", positive_float),
    ("--pue", "pue", positive_float),
    ("--usd-per-kwh", "usd_per_kwh", non_negative_float),
)


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "cost", help="memory-expansion 3-year TCO: DRAM vs flash",
        description="Memory-expansion TCO: CapEx + power x hours x years x PUE x $/kWh. "
                    "Each override takes one value (applied to every option) or one value "
                    "per --preset, in order.")
    parser.add_argument("--preset", nargs="+", choices=sorted(PRESETS),
                        default=list(DEFAULT_PRESETS),
                        help=f"options to compare (default: {' '.join(DEFAULT_PRESETS)})")
    for flag, field, kind in _OVERRIDES:
        parser.add_argument(flag, nargs="+", type=kind, metavar="X", dest=field,
                            help=f"override {field}")
    parser.add_argument("--json", metavar="OUT", help="write the comparison as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="write a stacked bar chart")
    parser.set_defaults(func=run)
    return parser


def options_from_args(args: argparse.Namespace) -> list[MemoryOption]:
    names = list(args.preset)
    options = []
    for i, name in enumerate(names):
        label = name if names[:i].count(name) == 0 else f"{name}-{names[:i].count(name) + 1}"
        options.append(dataclasses.replace(PRESETS[name], name=label))
    for flag, field, _ in _OVERRIDES:
        values = getattr(args, field)
        if values is None:
            continue
        if len(values) not in (1, len(options)):
            raise InputError(f"{flag} takes 1 value or one per --preset ({len(options)}), "
                             f"got {len(values)}")
        if len(values) == 1:
            values = values * len(options)
        options = [dataclasses.replace(o, **{field: v}) for o, v in zip(options, values)]
    return options


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        costs = compare(options_from_args(args))
        print(format_table(costs))
        if args.json:
            write_json(args.json, to_json(costs))
        if args.plot:
            plot(costs, args.plot)
        return EXIT_OK
    return run_guarded("cost", body)
