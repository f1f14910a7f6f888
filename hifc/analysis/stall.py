"""`hifc stall`: is flash swapping visible in throughput? (HIFC.md, "Stall budget").

The paper writes  T_gap = (TPS_ideal - TPS_test) x T_lat.  Read literally that is tok/s x s =
tokens: the tokens the measured pipeline falls short of the ideal over T_lat. We convert it to
time at the ideal rate, which is the stall the pipeline already tolerates:

    T_gap  = (TPS_ideal - TPS_test) x T_lat / TPS_ideal = T_lat x (1 - TPS_test / TPS_ideal)
    T_swap = T_fix + N_swap x B_size x s_tok / BW_flash
    swapping is visible  <=>  T_swap > T_gap

T_lat is the wall time of the measured run (s); N_swap the number of KV blocks swapped out;
B_size x s_tok the bytes of one block (tokens per block x KV bytes per token); BW_flash the tier's
write bandwidth (GiB/s); T_fix a fixed per-run overhead (submission, sync; default 0). Both the
literal form (tokens) and ours (seconds) are printed and written.

`--from-bench JSON` reads a throughput result; keys at the top level of the object:
    tps_ideal          tokens/s of the same workload without swapping (or the physical limit)
    tps_test           tokens/s measured with swapping
    elapsed_s          wall seconds of the measured run (T_lat)
    swap_out_blocks    KV blocks written to the tier during the run (N_swap)
    block_bytes        bytes of one KV block, all layers, K and V (B_size x s_tok)
    tier_write_gibps   tier write bandwidth, GiB/s (BW_flash)
    t_fix_s            optional fixed overhead, s
Any flag given on the command line overrides the file's value. Instead of --block-bytes you can
give --block-tokens and --bytes-per-token (the paper's B_size and s_tok).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from hifc.analysis.common import (
    EXIT_OK, GIB, InputError, get_number, non_negative_float, non_negative_int, positive_float,
    positive_int, read_json_object, run_guarded, write_json,
)


@dataclass(frozen=True)
class StallInput:
    tps_ideal: float
    tps_test: float
    t_lat_s: float
    swap_out_blocks: float
    block_bytes: float
    flash_gibps: float
    t_fix_s: float = 0.0

    def __post_init__(self) -> None:
        for field in ("tps_ideal", "t_lat_s", "block_bytes", "flash_gibps"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be > 0, got {getattr(self, field)}")
        for field in ("tps_test", "swap_out_blocks", "t_fix_s"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)}")


@dataclass(frozen=True)
class StallResult:
    t_gap_paper_tokens: float   # (TPS_ideal - TPS_test) x T_lat, the paper's literal form
    t_gap_s: float              # the same shortfall as time at the ideal rate
    swap_bytes: float
    t_swap_s: float
    headroom_s: float           # T_gap - T_swap; negative when swapping shows
    swap_to_gap: float | None   # T_swap / T_gap; None when T_gap is 0
    swap_visible: bool


def t_gap_s(tps_ideal: float, tps_test: float, t_lat_s: float) -> float:
    return t_lat_s * (1 - tps_test / tps_ideal)


def t_swap_s(t_fix_s: float, swap_blocks: float, block_bytes: float, flash_gibps: float) -> float:
    return t_fix_s + swap_blocks * block_bytes / (flash_gibps * GIB)


def evaluate(inp: StallInput) -> StallResult:
    gap = t_gap_s(inp.tps_ideal, inp.tps_test, inp.t_lat_s)
    swap = t_swap_s(inp.t_fix_s, inp.swap_out_blocks, inp.block_bytes, inp.flash_gibps)
    return StallResult(
        t_gap_paper_tokens=(inp.tps_ideal - inp.tps_test) * inp.t_lat_s, t_gap_s=gap,
        swap_bytes=inp.swap_out_blocks * inp.block_bytes, t_swap_s=swap, headroom_s=gap - swap,
        swap_to_gap=swap / gap if gap > 0 else None, swap_visible=swap > gap)


# ---------------------------------------------------------------------------------------- CLI

# StallInput field, bench JSON key, flag dest, must be > 0
_BENCH_KEYS = (
    ("tps_ideal", "tps_ideal", "tps_ideal", True),
    ("tps_test", "tps_test", "tps_test", False),
    ("t_lat_s", "elapsed_s", "t_lat", True),
    ("swap_out_blocks", "swap_out_blocks", "n_swap", False),
    ("block_bytes", "block_bytes", "block_bytes", True),
    ("flash_gibps", "tier_write_gibps", "flash_gibps", True),
    ("t_fix_s", "t_fix_s", "t_fix", False),
)


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "stall", help="stall budget: does flash swap time hide inside the throughput gap?",
        description="T_gap = T_lat x (1 - TPS_test/TPS_ideal); "
                    "T_swap = T_fix + N_swap x block bytes / BW_flash; visible if T_swap > T_gap.")
    parser.add_argument("--from-bench", metavar="JSON", help="throughput result (see keys in docs)")
    parser.add_argument("--tps-ideal", type=positive_float, help="ideal tokens/s")
    parser.add_argument("--tps-test", type=non_negative_float, help="measured tokens/s")
    parser.add_argument("--t-lat", type=positive_float, metavar="S",
                        help="wall seconds of the measured run")
    parser.add_argument("--n-swap", type=non_negative_int, metavar="BLOCKS",
                        help="KV blocks swapped out")
    parser.add_argument("--block-bytes", type=positive_int, help="bytes per KV block")
    parser.add_argument("--block-tokens", type=positive_int, help="tokens per block (B_size)")
    parser.add_argument("--bytes-per-token", type=positive_int,
                        help="KV bytes per token, all layers, K and V (s_tok)")
    parser.add_argument("--flash-gibps", type=positive_float, help="tier write GiB/s")
    parser.add_argument("--t-fix", type=non_negative_float, metavar="S",
                        help="fixed swap overhead in seconds (default 0)")
    parser.add_argument("--json", metavar="OUT", help="write inputs and verdict as JSON")
    parser.set_defaults(func=run)
    return parser


def input_from_args(args: argparse.Namespace) -> StallInput:
    if (args.block_tokens is None) != (args.bytes_per_token is None):
        raise InputError("--block-tokens and --bytes-per-token go together")
    if args.block_tokens is not None and args.block_bytes is not None:
        raise InputError("give --block-bytes or --block-tokens with --bytes-per-token, not both")
    if args.block_tokens is not None:
        args = argparse.Namespace(**{**vars(args),
                                     "block_bytes": args.block_tokens * args.bytes_per_token})
    bench = read_json_object(args.from_bench) if args.from_bench else {}
    values = {}
    for field, key, dest, positive in _BENCH_KEYS:
        value = getattr(args, dest)
        if value is None and key in bench:
            value = get_number(bench, key, args.from_bench, positive=positive)
        if value is None and field == "t_fix_s":
            value = 0.0
        if value is None:
            flag = "--" + dest.replace("_", "-")
            raise InputError(f"missing {field}: give {flag} or key {key!r} in --from-bench")
        values[field] = value
    if values["tps_test"] > values["tps_ideal"]:
        raise InputError(f"tps_test ({values['tps_test']:g}) exceeds tps_ideal "
                         f"({values['tps_ideal']:g}): the ideal must be an upper bound")
    return StallInput(**values)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        inp = input_from_args(args)
        res = evaluate(inp)
        print(f"T_gap   paper form (TPS_ideal - TPS_test) x T_lat = "
              f"({inp.tps_ideal:g} - {inp.tps_test:g}) x {inp.t_lat_s:g} = "
              f"{res.t_gap_paper_tokens:,.1f} tokens")
        print(f"        as time at the ideal rate: {res.t_gap_s:.3f} s "
              f"({1 - inp.tps_test / inp.tps_ideal:.1%} of {inp.t_lat_s:g} s)")
        print(f"T_swap  {inp.t_fix_s:g} s + {inp.swap_out_blocks:g} blocks x "
              f"{inp.block_bytes:,.0f} B / {inp.flash_gibps:g} GiB/s = {res.t_swap_s:.3f} s")
        ratio = f"{res.swap_to_gap:.1%} of the gap" if res.swap_to_gap is not None else "no gap"
        verdict = "VISIBLE: swapping costs throughput" if res.swap_visible else \
            "hidden: swapping fits inside the gap"
        print(f"verdict {verdict} ({ratio}, headroom {res.headroom_s:+.3f} s)")
        if args.json:
            write_json(args.json, {**asdict(inp), **asdict(res),
                                   "source": f"bench:{args.from_bench}" if args.from_bench
                                   else "flags"})
        return EXIT_OK
    return run_guarded("stall", body)
