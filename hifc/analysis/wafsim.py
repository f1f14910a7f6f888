"""`hifc wafsim`: write amplification of a tier block trace on a simulated SSD.

Each tier block is `block_bytes / page_bytes` consecutive flash pages (block id b covers logical
pages b*n .. b*n+n-1), so the tier is a file of `tier_blocks` blocks at the start of the drive's
logical space. The host write trace (`swaptrace`: a file, or the synthetic swap workload under the
append or left-append policy) is replayed on the page-mapped FTL of `ftl`, which reports
WAF = NAND page writes / host page writes. `--plot` draws block id against swap-out number, the
paper's Fig 5: append climbs and wraps, left-append scatters once churn has punched holes.

Defaults (assumptions, not the paper's drive): 16 KiB flash pages; 2048 pages (32 MiB) per erase
unit, standing for a superblock striped over dies and planes, the unit modern SSDs reclaim;
7% over-provisioning; 1 MiB tier blocks; preconditioned (full) logical space. What drives WAF is
the ratio of erase unit to tier block (32 here): at 4 or fewer tier blocks per erase unit every
policy gives ~1.0. With the default synthetic workload (fill 0.8, churn 0.2) append gives 1.00
and left-append ~1.4-1.5 over seeds 0-3, close to the paper's SMART figures (1.02 vs 1.40).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

import numpy as np

from hifc.analysis.common import (
    EXIT_OK, InputError, fraction, new_figure, non_negative_float, non_negative_int, positive_int,
    run_guarded, save_figure, unit_interval, write_json,
)
from hifc.analysis.ftl import FtlConfig, FtlStats, simulate
from hifc.analysis.swaptrace import (
    POLICIES, SwapTrace, SwapWorkload, generate, load_trace, save_trace,
)

MAX_PAGES_PER_WRITE = 1 << 16
MAX_LOGICAL_PAGES = 1 << 26   # 1 TiB of 16 KiB pages; the maps then take about 1 GiB of RAM


@dataclass(frozen=True)
class WafSimConfig:
    tier_blocks: int
    block_bytes: int = 1 << 20
    page_bytes: int = 16 << 10
    pages_per_erase_block: int = 2048
    over_provisioning: float = 0.07
    precondition: bool = True

    def __post_init__(self) -> None:
        if self.tier_blocks <= 0 or self.block_bytes <= 0 or self.page_bytes <= 0:
            raise ValueError("tier_blocks, block_bytes and page_bytes must be > 0")
        if self.block_bytes % self.page_bytes:
            raise ValueError(f"block_bytes ({self.block_bytes}) must be a multiple of "
                             f"page_bytes ({self.page_bytes})")
        if self.tier_blocks * self.pages_per_tier_block > MAX_LOGICAL_PAGES:
            raise ValueError(f"{self.tier_blocks} tier blocks of {self.pages_per_tier_block} "
                             f"pages exceed the simulator's {MAX_LOGICAL_PAGES} logical pages "
                             "(use larger pages or fewer tier blocks)")

    @property
    def pages_per_tier_block(self) -> int:
        return self.block_bytes // self.page_bytes

    def ftl_config(self) -> FtlConfig:
        return FtlConfig(logical_pages=self.tier_blocks * self.pages_per_tier_block,
                         pages_per_erase_block=self.pages_per_erase_block,
                         over_provisioning=self.over_provisioning, precondition=self.precondition)


@dataclass(frozen=True)
class WafResult:
    waf: float
    host_page_writes: int
    nand_page_writes: int
    gc_count: int
    gc_relocated_pages: int
    host_block_writes: int
    swap_outs: int


def page_writes(block_ids: np.ndarray, pages_per_block: int) -> list[np.ndarray]:
    """Split a block id stream into host writes of distinct logical pages, in order."""
    offsets = np.arange(pages_per_block, dtype=np.int64)
    max_blocks = max(1, MAX_PAGES_PER_WRITE // pages_per_block)
    writes, start, seen = [], 0, set()
    ids = block_ids.tolist()
    for i, block_id in enumerate(ids):
        if block_id in seen or i - start == max_blocks:
            writes.append(block_ids[start:i])
            start, seen = i, set()
        seen.add(block_id)
    writes.append(block_ids[start:])
    return [(run[:, None] * pages_per_block + offsets).ravel() for run in writes if run.size]


def replay(trace: SwapTrace, config: WafSimConfig) -> WafResult:
    ids = trace.block_ids
    if ids.size == 0:
        raise ValueError("empty trace")
    if int(ids.max()) >= config.tier_blocks:
        raise ValueError(f"trace has block id {int(ids.max())} >= tier_blocks "
                         f"{config.tier_blocks}")
    stats: FtlStats = simulate(config.ftl_config(), page_writes(ids, config.pages_per_tier_block))
    return WafResult(waf=stats.waf, host_page_writes=stats.host_page_writes,
                     nand_page_writes=stats.nand_page_writes, gc_count=stats.gc_count,
                     gc_relocated_pages=stats.gc_relocated_pages,
                     host_block_writes=trace.num_block_writes, swap_outs=len(trace.swap_outs))


def plot_trace(trace: SwapTrace, path: str, title: str) -> None:
    lengths = np.fromiter((len(g) for g in trace.swap_outs), dtype=np.int64)
    x = np.repeat(np.arange(len(trace.swap_outs)), lengths)
    fig = new_figure()
    ax = fig.add_subplot()
    ax.plot(x, trace.block_ids, ",", linestyle="none", color="tab:blue")
    ax.set_xlabel("swap-out number" if trace.grouped else "block write number")
    ax.set_ylabel("tier block id")
    ax.set_title(title)
    save_figure(fig, path)


# ---------------------------------------------------------------------------------------- CLI

def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "wafsim", help="FTL simulation: write amplification of a tier block trace",
        description="Replay a tier block write trace on a page-mapped FTL with greedy GC and "
                    "report WAF = NAND page writes / host page writes.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE",
                        help="block ids in write order: text (one swap-out per line) or JSON list")
    source.add_argument("--policy", choices=POLICIES,
                        help="generate a synthetic swap workload under this allocation policy")
    syn = parser.add_argument_group("synthetic workload (with --policy)")
    syn.add_argument("--swap-outs", type=positive_int, default=SwapWorkload.swap_outs)
    syn.add_argument("--seq-blocks", type=positive_int, nargs=2, metavar=("MIN", "MAX"),
                     default=(SwapWorkload.min_seq_blocks, SwapWorkload.max_seq_blocks),
                     help="KV blocks per swapped-out sequence, uniform in [MIN, MAX]")
    syn.add_argument("--fill", type=fraction, default=SwapWorkload.fill,
                     help="resident tier blocks kept at or below FILL x tier blocks")
    syn.add_argument("--churn", type=unit_interval, default=SwapWorkload.churn,
                     help="probability a swap-in resumes a random sequence instead of the oldest")
    syn.add_argument("--seed", type=non_negative_int, default=SwapWorkload.seed)
    syn.add_argument("--save-trace", metavar="OUT", help="write the generated trace (text)")
    ssd = parser.add_argument_group("simulated drive")
    ssd.add_argument("--tier-blocks", type=positive_int,
                     help=f"tier capacity in blocks (default: {SwapWorkload.tier_blocks} for "
                          "--policy; for --trace its num_blocks= header, else largest id + 1)")
    ssd.add_argument("--block-bytes", type=positive_int, default=WafSimConfig.block_bytes)
    ssd.add_argument("--page-bytes", type=positive_int, default=WafSimConfig.page_bytes)
    ssd.add_argument("--pages-per-erase-block", type=positive_int,
                     default=WafSimConfig.pages_per_erase_block)
    ssd.add_argument("--op", type=non_negative_float, default=WafSimConfig.over_provisioning,
                     help="over-provisioning fraction of the logical capacity")
    ssd.add_argument("--no-precondition", dest="precondition", action="store_false",
                     help="start from an empty drive instead of a sequentially filled one")
    parser.add_argument("--json", metavar="OUT", help="write WAF and counters as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="block id vs swap-out (Fig 5)")
    parser.set_defaults(func=run)
    return parser


def _trace_from_args(args: argparse.Namespace) -> tuple[SwapTrace, int]:
    if args.trace:
        if args.save_trace:
            raise InputError("--save-trace needs --policy (the trace file is already saved)")
        trace = load_trace(args.trace)
        return trace, args.tier_blocks or trace.tier_blocks or int(trace.block_ids.max()) + 1
    tier_blocks = args.tier_blocks or SwapWorkload.tier_blocks
    try:
        workload = SwapWorkload(tier_blocks=tier_blocks, swap_outs=args.swap_outs,
                                min_seq_blocks=args.seq_blocks[0],
                                max_seq_blocks=args.seq_blocks[1], fill=args.fill, churn=args.churn,
                                seed=args.seed)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    trace = generate(workload, args.policy)
    if args.save_trace:
        save_trace(trace, args.save_trace)
    return trace, tier_blocks


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        trace, tier_blocks = _trace_from_args(args)
        try:
            config = WafSimConfig(tier_blocks=tier_blocks, block_bytes=args.block_bytes,
                                  page_bytes=args.page_bytes,
                                  pages_per_erase_block=args.pages_per_erase_block,
                                  over_provisioning=args.op, precondition=args.precondition)
            result = replay(trace, config)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        groups = f"{result.swap_outs} swap-outs, " if trace.grouped else ""
        print(f"trace    {trace.source}: {groups}{result.host_block_writes} block writes into "
              f"{tier_blocks} tier blocks")
        print(f"drive    {config.pages_per_tier_block} pages/block of {config.page_bytes} B, "
              f"{config.pages_per_erase_block} pages/erase block, OP {config.over_provisioning:g}"
              f"{', preconditioned' if config.precondition else ''}")
        print(f"writes   host {result.host_page_writes:,} pages, NAND "
              f"{result.nand_page_writes:,} pages, {result.gc_count:,} GCs "
              f"({result.gc_relocated_pages:,} pages copied)")
        print(f"WAF      {result.waf:.3f}")
        if args.json:
            write_json(args.json, {**asdict(result), **asdict(config),
                                   "pages_per_tier_block": config.pages_per_tier_block,
                                   "source": trace.source})
        if args.plot:
            plot_trace(trace, args.plot, f"{trace.source}  (WAF {result.waf:.2f})")
        return EXIT_OK
    return run_guarded("wafsim", body)
