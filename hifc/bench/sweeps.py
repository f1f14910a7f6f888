"""``hifc bench sweep``: the paper's throughput figures, redrawn as JSON plus a PNG.

  io-length    Fig 3: batch 10, growing input length (at a fixed output length) and growing
               output length (at a fixed input length); two panels
  concurrency  Fig 4: concurrency (max_num_seqs) 1..20 at a 5k context, fixed KV budget
  block-size   Fig 6: block size 16..256 tokens at a 10k context, batch 10; also plots the raw
               swap I/O time per variant

Each point runs the chosen variants (``--compare``, default dram,flash; none, recompute and
auto are allowed) through ``hifc bench throughput``'s code, each on a fresh engine, with fixed
input/output lengths and random token ids. The plot shows output tokens/s per variant and, on a
second axis, the preemptions (swap-outs, or recomputes for ``recompute``). The JSON is rewritten
after every point, so a run cut short keeps what it measured; the PNG is drawn at the end (also
when a point fails), or later from the JSON with ``hifc.bench.plots.plot_sweep``.

Defaults are the paper's settings for the 8B preset on a GPU (``FIGURES``; where the paper
gives no value, e.g. Fig 3's KV budget and tier sizes, the values are ours and chosen so that
swapping starts inside the sweep). On the GPU, where the engine is host-bound at ~25-30 ms a
decode step, the full defaults take hours; ``scripts/gpu_paper_run.sh`` runs reduced ones.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from hifc.analysis.common import int_list
from hifc.bench.throughput import (SWEEP_COLUMNS, check_budget, compare, device_rates,
                                   engine_settings, fixed_workload, parse_variants, summarize,
                                   variant_cells, variant_header, variant_options)
from hifc.config import BLOCK_SIZES, EngineConfig, add_engine_args, engine_config_from_args


@dataclass(frozen=True)
class FigureSpec:
    paper: str              # the paper's figure
    title: str
    input_len: int          # fixed input length (io-length: of the output-length panel)
    output_len: int         # fixed output length (io-length: of the input-length panel)
    num_prompts: int
    max_num_seqs: int
    block_size: int
    kv_cache_gib: float     # KV budget of the budgeted variants
    tier_gib: float         # DRAM and flash tier size unless --swap-space / --flash-size-gib
    input_lens: tuple[int, ...] = ()
    output_lens: tuple[int, ...] = ()
    concurrency: tuple[int, ...] = ()
    block_sizes: tuple[int, ...] = ()


FIGURES = {
    "io-length": FigureSpec(
        "Fig 3", "throughput vs input / output length", input_len=1024,
        output_len=1024, num_prompts=10, max_num_seqs=10, block_size=64, kv_cache_gib=4.0,
        tier_gib=16.0, input_lens=(1024, 2048, 3072, 4096, 6144, 8192),
        output_lens=(1024, 2048, 4096, 6144, 8192)),
    "concurrency": FigureSpec(
        "Fig 4", "throughput vs concurrency", input_len=4096,
        output_len=1024, num_prompts=20, max_num_seqs=20, block_size=64, kv_cache_gib=9.1,
        tier_gib=16.0, concurrency=(1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20)),
    "block-size": FigureSpec(
        "Fig 6", "throughput and swap I/O vs block size",
        input_len=9216, output_len=1024, num_prompts=10, max_num_seqs=10, block_size=64,
        kv_cache_gib=8.0, tier_gib=16.0, block_sizes=(16, 32, 64, 128, 256)),
}
# --option -> the figure it sweeps
POINT_OPTIONS = {"input_lens": "io-length", "output_lens": "io-length",
                 "concurrency": "concurrency", "block_sizes": "block-size"}


@dataclass(frozen=True)
class SweepPoint:
    panel: str  # the swept quantity: input_len, output_len, max_num_seqs or block_size
    x: int
    input_len: int
    output_len: int
    max_num_seqs: int
    block_size: int


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="throughput sweeps of the paper's Fig 3, 4 and 6")
    p.add_argument("--figure", required=True, choices=sorted(FIGURES))
    p.add_argument("--compare", default="dram,flash",
                   help="comma-separated variants (see hifc bench throughput)")
    s = p.add_argument_group("sweep (defaults: the figure's, see hifc/bench/sweeps.py)")
    s.add_argument("--input-lens", type=int_list, help="io-length: input lengths, at --output-len")
    s.add_argument("--output-lens", type=int_list,
                   help="io-length: output lengths, at --input-len")
    s.add_argument("--concurrency", type=int_list, help="concurrency: max_num_seqs values")
    s.add_argument("--block-sizes", type=int_list, help="block-size: block sizes")
    s.add_argument("--input-len", type=int, help="fixed input length")
    s.add_argument("--output-len", type=int, help="fixed output length")
    s.add_argument("--num-prompts", type=int, help="requests per point")
    p.add_argument("--json", dest="json_out", help="write the sweep as JSON here")
    p.add_argument("--plot", help="draw the figure as PNG here")
    p.add_argument("--no-progress", action="store_true")
    add_engine_args(p, model="random:ds-r1-llama-8b")
    p.set_defaults(func=run)  # engine flags left out are None: the figure's values apply


def sweep_points(figure: str, spec: FigureSpec, args) -> list[SweepPoint]:
    for option, owner in POINT_OPTIONS.items():
        if getattr(args, option) is not None and owner != figure:
            raise ValueError(f"--{option.replace('_', '-')} applies to --figure {owner}")
    values = {o: getattr(args, o) if getattr(args, o) is not None else getattr(spec, o)
              for o in POINT_OPTIONS}
    inp, out, seqs, block = (_given(args.input_len, spec.input_len),
                             _given(args.output_len, spec.output_len),
                             _given(args.max_num_seqs, spec.max_num_seqs),
                             _given(args.block_size, spec.block_size))
    if inp < 1 or out < 1:
        raise ValueError("--input-len and --output-len must be positive")
    if figure == "io-length":
        points = [SweepPoint("input_len", i, i, out, seqs, block) for i in values["input_lens"]]
        points += [SweepPoint("output_len", o, inp, o, seqs, block)
                   for o in values["output_lens"]]
    elif figure == "concurrency":
        points = [SweepPoint("max_num_seqs", c, inp, out, c, block)
                  for c in values["concurrency"]]
    else:
        bad = [b for b in values["block_sizes"] if b not in BLOCK_SIZES]
        if bad:
            raise ValueError(f"block sizes must be from {', '.join(map(str, BLOCK_SIZES))}, "
                             f"got {bad}")
        points = [SweepPoint("block_size", b, inp, out, seqs, b) for b in values["block_sizes"]]
    if not points:
        raise ValueError(f"--figure {figure}: no point to run")
    return points


def _given(value, default):
    return default if value is None else value


def base_options(figure: str, spec: FigureSpec, args) -> dict:
    """The shared engine options, with the figure's defaults where no flag was given."""
    if figure == "block-size" and args.num_gpu_blocks is not None:
        raise ValueError("the block-size sweep needs --kv-cache-gib: a block count is a "
                         "different budget at each block size")
    filled = argparse.Namespace(**vars(args))
    filled.max_num_seqs = _given(args.max_num_seqs, spec.max_num_seqs)
    filled.block_size = _given(args.block_size, spec.block_size)
    if args.kv_cache_gib is None and args.num_gpu_blocks is None:
        filled.kv_cache_gib = spec.kv_cache_gib
    if args.swap_space is None and args.flash_size_gib is None:
        filled.swap_space = filled.flash_size_gib = spec.tier_gib
    elif args.flash_size_gib is None:
        filled.flash_size_gib = args.swap_space
    return engine_config_from_args(filled).options()


def run(args: argparse.Namespace) -> int:
    spec = FIGURES[args.figure]
    variants = parse_variants(args.compare)
    num_prompts = spec.num_prompts if args.num_prompts is None else args.num_prompts
    if num_prompts < 1:
        raise ValueError("--num-prompts must be positive")
    points = sweep_points(args.figure, spec, args)
    base = base_options(args.figure, spec, args)
    check_budget(variants, base)
    rates = device_rates(base)
    for point in points:  # every point's engine options are valid before anything runs
        for name in variants:
            EngineConfig.from_options(**variant_options(name, point_options(base, point)))
    sweep = {"figure": args.figure, "paper": spec.paper, "title": spec.title,
             "compare": variants, "num_prompts": num_prompts,
             "settings": engine_settings(base), "points": []}
    try:
        for point in points:
            workload, results = compare(
                variants, point_options(base, point),
                lambda engine, p=point: fixed_workload(engine, p.input_len, p.output_len,
                                                       num_prompts, base["seed"]),
                rates=rates, progress=not args.no_progress, label=f"{point.panel}={point.x} ")
            sweep["points"].append({**asdict(point), "workload": workload,
                                    **summarize(results)})
            if args.json_out:  # after every point: a run cut short keeps what it measured
                with open(args.json_out, "w") as f:
                    json.dump(sweep, f, indent=2)
    finally:  # also after a failure part-way: the points measured so far
        if args.plot and sweep["points"]:
            from hifc.bench.plots import plot_sweep
            plot_sweep(sweep, args.plot)
    print_sweep(sweep)
    return 0


def point_options(base: dict, point: SweepPoint) -> dict:
    return dict(base, max_num_seqs=point.max_num_seqs, block_size=point.block_size)


def print_sweep(sweep: dict) -> None:
    s = sweep["settings"]
    budget = (f"{s['kv_cache_gib']} GiB" if s["kv_cache_gib"] is not None
              else f"{s['num_gpu_blocks']} blocks")
    print(f"{sweep['paper']}-like sweep ({sweep['figure']}): {sweep['title']}")
    print(f"model {s['model']}  prompts/point {sweep['num_prompts']}  KV budget {budget}")
    print(f"{'panel':>12} {'x':>6} {'in':>6} {'out':>6} {'seqs':>4} {'block':>5} "
          + variant_header(SWEEP_COLUMNS))
    for p in sweep["points"]:
        for r in p["variants"]:
            print(f"{p['panel']:>12} {p['x']:>6} {p['input_len']:>6} {p['output_len']:>6} "
                  f"{p['max_num_seqs']:>4} {p['block_size']:>5} " + variant_cells(r, SWEEP_COLUMNS))
