"""`hifc endurance`: write budget (TBW) of the pSLC region and the lifetime it buys.

    TBW            = P/E cycles x region size            (total host bytes the region can absorb)
    lifetime_years = TBW / (daily host writes x WAF x 365)

Units: binary throughout. Sizes are GiB, TBW and daily writes TiB (1 TiB = 1024 GiB = 2**40 B).
The paper's "30,000 x 200 GiB = 6,000 TiB" rounds: the exact product is 6,000,000 GiB =
5,859.375 TiB, and with 1.98 TiB/day that lasts 5,859.375 / (1.98 x 365) = 8.11 years. The paper's
~8.3 years is 6,000 / (1.98 x 365); pass `--tbw-tib 6000` to reproduce it. The lifetime ratio does
not depend on the unit as long as TBW and daily writes use the same one.

`--waf` (default 1.0, the paper's formula) scales host writes to NAND writes, which is what the
P/E budget pays for; feed it the WAF that `hifc wafsim` or SMART reports.

`--from-bench JSON` reads the write rate a throughput run measured. Keys (top level of the object):
    tier_bytes_written  bytes the run wrote to the flash tier (swap-outs)     number >= 0
    elapsed_s           wall-clock seconds of that run                        number > 0
daily writes = tier_bytes_written / elapsed_s x 86400 x duty_cycle, in TiB; `--duty-cycle`
(default 1.0) is the fraction of the day the server runs at that rate.

Reference: TLC mode is rated 750 TBW (decimal TB, vendor convention); the output reports the pSLC
budget as a multiple of it (paper: 8x).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from hifc.analysis.common import (
    EXIT_OK, TIB, InputError, fraction, get_number, positive_float, read_json_object,
    run_guarded, write_json,
)

SECONDS_PER_DAY = 86400
DAYS_PER_YEAR = 365
TLC_RATING_BYTES = 750e12  # "750 TBW", decimal terabytes
PSLC_PE_CYCLES = 30000
PSLC_REGION_GIB = 200


@dataclass(frozen=True)
class EnduranceInput:
    daily_write_tib: float           # host writes to the tier per day
    pe_cycles: float = PSLC_PE_CYCLES
    region_gib: float = PSLC_REGION_GIB
    waf: float = 1.0
    tbw_tib: float | None = None     # overrides pe_cycles x region_gib when set

    def __post_init__(self) -> None:
        for field in ("daily_write_tib", "pe_cycles", "region_gib"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be > 0, got {getattr(self, field)}")
        if self.waf < 1:
            raise ValueError(f"waf must be >= 1, got {self.waf}")
        if self.tbw_tib is not None and self.tbw_tib <= 0:
            raise ValueError(f"tbw_tib must be > 0, got {self.tbw_tib}")


@dataclass(frozen=True)
class EnduranceResult:
    tbw_gib: float
    tbw_tib: float
    tbw_vs_tlc_rating: float
    nand_write_tib_per_day: float
    lifetime_days: float
    lifetime_years: float


def tbw_tib(pe_cycles: float, region_gib: float) -> float:
    return pe_cycles * region_gib / 1024


def lifetime_years(tbw_tib_: float, daily_write_tib: float, waf: float = 1.0) -> float:
    return tbw_tib_ / (daily_write_tib * waf * DAYS_PER_YEAR)


def daily_write_tib_from_rate(bytes_written: float, elapsed_s: float,
                              duty_cycle: float = 1.0) -> float:
    return bytes_written / elapsed_s * SECONDS_PER_DAY * duty_cycle / TIB


def evaluate(inp: EnduranceInput) -> EnduranceResult:
    budget_tib = inp.tbw_tib if inp.tbw_tib is not None else tbw_tib(inp.pe_cycles, inp.region_gib)
    years = lifetime_years(budget_tib, inp.daily_write_tib, inp.waf)
    return EnduranceResult(
        tbw_gib=budget_tib * 1024, tbw_tib=budget_tib,
        tbw_vs_tlc_rating=budget_tib * TIB / TLC_RATING_BYTES,
        nand_write_tib_per_day=inp.daily_write_tib * inp.waf,
        lifetime_days=years * DAYS_PER_YEAR, lifetime_years=years)


def daily_writes_from_bench(path: str, duty_cycle: float) -> float:
    data = read_json_object(path)
    written = get_number(data, "tier_bytes_written", path)
    elapsed = get_number(data, "elapsed_s", path, positive=True)
    if written == 0:
        raise InputError(f"{path}: tier_bytes_written is 0 (the run never swapped to flash), "
                         "so the lifetime is unbounded")
    return daily_write_tib_from_rate(written, elapsed, duty_cycle)


# ---------------------------------------------------------------------------------------- CLI

def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "endurance", help="pSLC write budget (TBW) and lifetime from daily KV writes",
        description="TBW = P/E cycles x region; lifetime = TBW / (daily writes x WAF x 365). "
                    "Binary units (GiB, TiB).")
    parser.add_argument("--pe-cycles", type=positive_float, default=PSLC_PE_CYCLES,
                        help=f"program/erase cycles of the region (default {PSLC_PE_CYCLES}, pSLC)")
    parser.add_argument("--region-gib", type=positive_float, default=PSLC_REGION_GIB,
                        help=f"size of the written region in GiB (default {PSLC_REGION_GIB})")
    parser.add_argument("--tbw-tib", type=positive_float,
                        help="use this TBW instead of P/E x region (e.g. 6000 for the paper's)")
    parser.add_argument("--waf", type=positive_float, default=1.0,
                        help="write amplification, NAND/host writes (default 1.0)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--daily-write-tib", type=positive_float,
                        help="host writes to the tier per day, TiB")
    source.add_argument("--from-bench", metavar="JSON",
                        help="throughput result with tier_bytes_written and elapsed_s")
    parser.add_argument("--duty-cycle", type=fraction, default=1.0,
                        help="with --from-bench: fraction of the day at the measured rate")
    parser.add_argument("--json", metavar="OUT", help="write inputs and results as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        if args.waf < 1:
            raise InputError(f"--waf must be >= 1 (NAND writes cannot be fewer than host "
                             f"writes), got {args.waf}")
        if args.from_bench:
            daily = daily_writes_from_bench(args.from_bench, args.duty_cycle)
            source = f"bench:{args.from_bench}"
        else:
            if args.duty_cycle != 1.0:
                raise InputError("--duty-cycle applies only with --from-bench")
            daily, source = args.daily_write_tib, "flag"
        inp = EnduranceInput(daily_write_tib=daily, pe_cycles=args.pe_cycles,
                             region_gib=args.region_gib, waf=args.waf, tbw_tib=args.tbw_tib)
        res = evaluate(inp)
        budget = (f"{args.tbw_tib:g} TiB (given)" if args.tbw_tib is not None else
                  f"{inp.pe_cycles:g} P/E x {inp.region_gib:g} GiB = {res.tbw_gib:,.0f} GiB")
        print(f"TBW        {budget} = {res.tbw_tib:,.3f} TiB "
              f"({res.tbw_vs_tlc_rating:.2f}x the 750 TBW TLC rating)")
        print(f"writes     {daily:.4g} TiB/day host ({source}) x WAF {inp.waf:g} = "
              f"{res.nand_write_tib_per_day:.4g} TiB/day NAND")
        print(f"lifetime   {res.lifetime_years:.2f} years ({res.lifetime_days:,.0f} days)")
        if args.json:
            payload = {**asdict(inp), **asdict(res), "source": source,
                       "duty_cycle": args.duty_cycle if args.from_bench else None}
            write_json(args.json, payload)
        return EXIT_OK
    return run_guarded("endurance", body)
