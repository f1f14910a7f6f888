"""``hifc bench io``: flash tier bandwidth against raw O_DIRECT on the same file (paper Table 5).

One run, one cache file of ``--size-gib``, split into two equal halves of tier blocks:

0. precondition: one raw sequential write over the whole file (``first_write_gibps``), so that
   every phase below overwrites allocated space; then one untimed tier warm-up batch out and in;
1. ``--repeats`` K repeats (default 5). In each, the tier works on one half and the raw baseline
   on the other (they swap halves every two repeats), so neither side overwrites the other's
   data; the sequential phases are interleaved, in ABBA order so that drift of the disk cancels:
   odd repeats ``raw W, tier W, raw R, tier R``, even repeats ``tier W, raw W, tier R, raw R``;
   then the tier's random write and read (the same blocks shuffled: one block per I/O);
2. a bit-exactness check of one batch after every repeat.

Sequential tier phases are swap-outs/-ins of ``--batch-blocks`` append-ordered blocks (adjacent
blocks coalesced into chunks of up to ``--chunk-mib``); every record is verified on swap-in.
The raw side replays the very I/O list of a tier sequential phase (same offsets within its half,
same I/O sizes, kvikio's per-request split into ``task_size`` pieces included) from as many
threads as the tier has, doing nothing but I/O: the ratio isolates what the tier adds.

Tier GiB/s count KV payload; raw GiB/s count bytes on disk. A repeat's ``tier/raw`` ratio compares
equal bytes on disk (raw seconds / tier seconds). The results are per-phase medians over the
repeats and the median (and min, max) of the per-repeat ratios, judged against 0.95. Where
O_DIRECT is refused (or ``--no-direct``), write phases end with a timed ``fdatasync`` on both
sides and the file's cached pages are dropped before every read phase; tmpfs is reported.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import time

from hifc.analysis.common import positive_float
from hifc.bench.rawio import (MIB, RawIO, describe_sizes, filesystem_of, io_summary,
                              kvikio_task_bytes, precondition_tasks, split_pieces, tier_io_tasks)

GIB = 1 << 30
TARGET_RATIO = 0.95
SEQ_ORDERS = (("raw_seq_write", "tier_seq_write", "raw_seq_read", "tier_seq_read"),  # A B,
              ("tier_seq_write", "raw_seq_write", "tier_seq_read", "raw_seq_read"))  # B A
RAND_PHASES = ("tier_rand_write", "tier_rand_read")


def add_geometry_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("KV block geometry (default: DeepSeek-R1-Distill-Llama-8B, 64 tokens)")
    g.add_argument("--layers", type=int, default=32)
    g.add_argument("--kv-heads", type=int, default=8)
    g.add_argument("--head-dim", type=int, default=128)
    g.add_argument("--block-size", type=int, default=64, help="tokens per block")
    g.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the KV cache tensor lives (auto: cuda if present)")


def geometry_from_args(args):
    from hifc.tiers.geometry import KVGeometry
    return KVGeometry(args.layers, args.kv_heads, args.head_dim, args.block_size, args.dtype)


def device_from_args(args) -> str:
    import torch
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return args.device


def register(subparsers) -> argparse.ArgumentParser:
    from hifc.tiers.config import FLASH_BACKENDS
    from hifc.tiers.flash.layout import DEFAULT_LAYOUT, LAYOUTS

    p = subparsers.add_parser("io", help="flash tier I/O bandwidth vs raw O_DIRECT (Table 5)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--path", required=True, help="cache file to create (or reuse)")
    p.add_argument("--size-gib", type=positive_float, required=True, help="cache file size")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--layout", default=DEFAULT_LAYOUT, choices=LAYOUTS)
    p.add_argument("--backend", default="auto", choices=FLASH_BACKENDS)
    p.add_argument("--threads", type=int, default=8, help="I/O threads (tier and raw)")
    p.add_argument("--chunk-mib", type=int, default=32, help="largest coalesced I/O")
    p.add_argument("--batch-blocks", type=int, default=32, help="blocks per swap job")
    p.add_argument("--repeats", type=int, default=5,
                   help="interleaved raw/tier repeats (ABBA order); results are medians")
    p.add_argument("--no-direct", action="store_true", help="buffered I/O instead of O_DIRECT")
    p.add_argument("--keep", action="store_true", help="keep a cache file this run created")
    add_geometry_args(p)
    p.set_defaults(func=run)
    return p


# -- the tier's phases --------------------------------------------------------------------------
def _timed_jobs(tier, submit, batches, after=None) -> float:
    start = time.perf_counter()
    jobs = [submit(batch) for batch in batches]
    for job in jobs:
        tier.wait(job)
    if after is not None:
        after()
    elapsed = time.perf_counter() - start
    failed = [job for job in jobs if not job.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} swap jobs failed; first: {failed[0].error}")
    return elapsed


def _swap_out(tier, kv, owner):
    return lambda b: tier.submit_swap_out(kv, list(zip(range(len(b)), b)), owner)


def _swap_in(tier, kv, owner):
    return lambda b: tier.submit_swap_in(kv, list(zip(b, range(len(b)))), owner)


def _check_exact(tier, kv, first_batch, owner) -> bool:
    """Tier block first_batch[i] holds kv block i (written by the last write phase)."""
    import torch
    expect = kv.clone()
    kv.zero_()
    n = len(first_batch)
    job = tier.wait(tier.submit_swap_in(kv, list(zip(first_batch, range(n))), owner))
    exact = job.ok and torch.equal(kv[:, :, :n], expect[:, :, :n])
    kv.copy_(expect)
    return exact


def _one_repeat(k: int, ctx: dict) -> dict:
    """Repeat ``k`` (0-based): interleaved sequential phases, then the tier's random phases."""
    tier, raw, kv, batch, owner = ctx["tier"], ctx["raw"], ctx["kv"], ctx["batch"], ctx["owner"]
    tier_half = (k // 2) % 2
    ids = ctx["halves"][tier_half]
    raw_tasks = ctx["raw_tasks"][1 - tier_half]
    shuffled = list(ids)
    random.Random(k).shuffle(shuffled)
    seq = [ids[i:i + batch] for i in range(0, len(ids), batch)]
    rand = [shuffled[i:i + batch] for i in range(0, len(ids), batch)]
    swap_out, swap_in = _swap_out(tier, kv, owner), _swap_in(tier, kv, owner)
    phases = {
        "raw_seq_write": lambda: raw.run(raw_tasks, write=True),
        "raw_seq_read": lambda: raw.run(raw_tasks, write=False),
        "tier_seq_write": lambda: _timed_jobs(tier, swap_out, seq, after=raw.sync),
        "tier_seq_read": lambda: _timed_jobs(tier, swap_in, seq),
        "tier_rand_write": lambda: _timed_jobs(tier, swap_out, rand, after=raw.sync),
        "tier_rand_read": lambda: _timed_jobs(tier, swap_in, rand),
    }
    order = SEQ_ORDERS[k % 2] + RAND_PHASES
    seconds = {}
    for name in order:
        if name.endswith("_read") and not ctx["direct"]:
            raw.drop_cache()  # buffered I/O: reads must come from the device, not the cache
        seconds[name] = phases[name]()
    result = {"repeat": k + 1, "order": list(order), "tier_half": tier_half,
              "seconds": seconds, "verified_bit_exact": _check_exact(tier, kv, rand[0], owner)}
    payload, disk, raw_bytes = ctx["payload_bytes"], ctx["disk_bytes"], ctx["raw_bytes"]
    for op in ("write", "read"):
        for pattern in ("seq", "rand"):
            result[f"{pattern}_{op}_gibps"] = payload / GIB / seconds[f"tier_{pattern}_{op}"]
        raw_s = seconds[f"raw_seq_{op}"]
        result[f"raw_seq_{op}_gibps"] = raw_bytes / GIB / raw_s
        result[f"seq_{op}_ratio"] = (disk / seconds[f"tier_seq_{op}"]) / (raw_bytes / raw_s)
    return result


# -- the run ------------------------------------------------------------------------------------
def _describe_sides(chunk_blocks: int, tier_tasks, raw_tasks, piece, threads: int,
                    kvikio: bool) -> tuple[dict, dict]:
    tier_s, raw_s = io_summary(tier_tasks), io_summary(raw_tasks)
    runs_per_chunk = max(len(t) for t in tier_tasks)
    if piece:
        fan_out = (f"kvikio splits each request into {piece / MIB:.2f} MiB pieces over its own "
                   f"{threads} threads")
    elif kvikio:
        fan_out = "kvikio's task size is unknown: raw issues whole runs"
    else:
        fan_out = f"{runs_per_chunk} I/O(s) per chunk, issued in order by an I/O thread"
    work = "prep threads gather + crc32c + headers, I/O threads only issue I/O"
    tier = {"threads": threads, "queue_depth_max": threads, "work": work,
            "chunk_blocks": chunk_blocks, "io_split_bytes": piece, **tier_s,
            "text": f"{threads} I/O threads, chunks of <= {chunk_blocks} blocks: "
                    f"{work}; {fan_out}; {describe_sizes(tier_s)} per sequential phase; "
                    f"queue depth <= {threads}"}
    raw = {"threads": threads, "queue_depth_max": threads, "work": "I/O only",
           "pattern": "replay of the tier's sequential I/O list on the other half", **raw_s,
           "text": f"{threads} threads, I/O only, replaying the I/O list of a tier sequential "
                   f"phase on the other half of the file: {describe_sizes(raw_s)}; queue depth "
                   f"<= {threads}"}
    return tier, raw


def _median_stats(per_repeat: list[dict]) -> dict:
    out = {}
    for key in ("seq_write_gibps", "seq_read_gibps", "rand_write_gibps", "rand_read_gibps",
                "raw_seq_write_gibps", "raw_seq_read_gibps"):
        out[key] = statistics.median(r[key] for r in per_repeat)
    for op in ("write", "read"):
        ratios = [r[f"seq_{op}_ratio"] for r in per_repeat]
        out[f"seq_{op}_ratio"] = statistics.median(ratios)
        out[f"seq_{op}_ratio_min"], out[f"seq_{op}_ratio_max"] = min(ratios), max(ratios)
        out[f"seq_{op}_pass"] = out[f"seq_{op}_ratio"] >= TARGET_RATIO
    return out


def measure(args) -> dict:
    import torch

    from hifc.tiers import TierConfig, make_tier
    from hifc.tiers.flash.layout import SUPERBLOCK_BYTES

    geometry = geometry_from_args(args)
    device = device_from_args(args)
    if min(args.batch_blocks, args.threads, args.chunk_mib, args.repeats) < 1:
        raise ValueError("--batch-blocks, --threads, --chunk-mib and --repeats must be positive")
    config = TierConfig(kv_offload="flash", flash_path=args.path, flash_size_gib=args.size_gib,
                        flash_layout=args.layout, flash_backend=args.backend,
                        flash_io_threads=args.threads, flash_chunk_mib=args.chunk_mib,
                        flash_direct_io=not args.no_direct)
    tier = make_tier(config, geometry, device)
    raw = None
    try:
        if tier.num_blocks < 2:
            raise ValueError(f"--size-gib {args.size_gib} holds {tier.num_blocks} block(s); the "
                             "benchmark needs at least 2 (one half for the tier, one for raw)")
        stats, layout = tier.stats(), tier.layout
        half = tier.num_blocks // 2
        ids = sorted(tier.reserve(tier.num_blocks))
        halves = (ids[:half], ids[half:2 * half])
        batch = min(args.batch_blocks, half)
        piece = kvikio_task_bytes() if stats["backend"] == "kvikio" else None
        tier_tasks = [tier_io_tasks(layout, h, batch, stats["chunk_blocks"]) for h in halves]
        raw_tasks = [split_pieces(t, piece) for t in tier_tasks]
        io_bytes = args.chunk_mib * MIB
        largest = max(length for t in raw_tasks for task in t for _, length in task)
        raw = RawIO(args.path, args.threads, max(largest, io_bytes), not args.no_direct)
        direct = bool(stats["direct_io"] and raw.direct)
        raw.sync_writes = not direct
        # Precondition: write the whole data area once, so that every phase overwrites
        # allocated blocks; the first write into freshly preallocated (unwritten) extents costs
        # the file system extra metadata work and is reported on its own.
        data = (SUPERBLOCK_BYTES, layout.file_bytes)
        first_s = raw.run(precondition_tasks(*data, io_bytes), write=True)
        shape = (geometry.num_layers, 2, batch, geometry.block_size, geometry.num_kv_heads,
                 geometry.head_dim)
        kv = torch.randn(shape, dtype=torch.float32, device=device).to(getattr(torch,
                                                                              geometry.dtype))
        owner = (1, 0)
        warm = [halves[0][:batch]]  # untimed: first-use costs (kvikio's thread pool, bounce
        _timed_jobs(tier, _swap_out(tier, kv, owner), warm)  # buffers) are not bandwidth
        _timed_jobs(tier, _swap_in(tier, kv, owner), warm)
        ctx = {"tier": tier, "raw": raw, "kv": kv, "batch": batch, "owner": owner,
               "halves": halves, "raw_tasks": raw_tasks, "direct": direct,
               "payload_bytes": half * geometry.block_bytes,
               "disk_bytes": io_summary(tier_tasks[0])["bytes"],
               "raw_bytes": io_summary(raw_tasks[0])["bytes"]}
        per_repeat = [_one_repeat(k, ctx) for k in range(args.repeats)]
        tier.free(ids)
        tier_io, raw_io = _describe_sides(min(batch, stats["chunk_blocks"]), tier_tasks[0],
                                          raw_tasks[0], piece, args.threads,
                                          stats["backend"] == "kvikio")
        raw_note, raw_direct = raw.note, raw.direct
    finally:
        if raw is not None:
            raw.close()
        tier.close()
    fs = filesystem_of(args.path)
    result = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "path": args.path, "size_gib": args.size_gib, "device": device,
        "backend": stats["backend"], "layout": layout.name, "direct_io": stats["direct_io"],
        "raw_direct_io": raw_direct, "io_notes": stats["io_notes"], "raw_note": raw_note,
        "filesystem": fs, "page_cache": _page_cache_text(direct, fs),
        "threads": args.threads, "chunk_mib": args.chunk_mib, "batch_blocks": batch,
        "num_blocks": tier.num_blocks, "block_bytes": geometry.block_bytes,
        "slice_bytes": geometry.slice_bytes, "phase_blocks": half,
        "payload_bytes": ctx["payload_bytes"], "tier_disk_bytes": ctx["disk_bytes"],
        "raw_bytes": ctx["raw_bytes"], "payload_fraction": ctx["payload_bytes"] / ctx["disk_bytes"],
        "geometry": {"layers": geometry.num_layers, "kv_heads": geometry.num_kv_heads,
                     "head_dim": geometry.head_dim, "block_size": geometry.block_size,
                     "dtype": geometry.dtype},
        "tier_io": tier_io, "raw_io": raw_io, "repeats": args.repeats,
        "target_ratio": TARGET_RATIO,
        "first_write_gibps": (data[1] - data[0]) / GIB / first_s,
        "verified_bit_exact": all(r["verified_bit_exact"] for r in per_repeat),
    }
    result.update(_median_stats(per_repeat))
    result["per_repeat"] = per_repeat
    return result


def _page_cache_text(direct: bool, fs: dict) -> str:
    if fs["type"] == "tmpfs":
        return ("tmpfs: the file lives in memory, no device is measured (memory-copy bandwidth; "
                "O_DIRECT " + ("accepted" if direct else "refused") + ")")
    if direct:
        return "bypassed: O_DIRECT on both sides"
    return ("buffered I/O (O_DIRECT off or refused): on both sides, write phases end with a "
            "timed fdatasync and the file's pages are evicted (POSIX_FADV_DONTNEED) before "
            "every read phase")


def print_table(r: dict) -> None:
    fs = r["filesystem"]
    print(f"hifc bench io: {r['path']}  {r['num_blocks']} blocks x {r['block_bytes'] / MIB:.2f}"
          f" MiB  layout={r['layout']}  backend={r['backend']}  device={r['device']}  "
          f"threads={r['threads']}  chunk={r['chunk_mib']} MiB  batch={r['batch_blocks']}")
    print(f"  file system: {fs['type']} ({fs['source']} on {fs['mount']})")
    for note in r["io_notes"]:
        print(f"  tier I/O: {note}")
    print(f"  raw I/O: {r['raw_note']}")
    print(f"  page cache: {r['page_cache']}")
    if not (r["direct_io"] and r["raw_direct_io"]) or fs["type"] == "tmpfs":
        print("  WARNING: O_DIRECT not in effect or no device behind the file: see page cache")
    print(f"  tier side: {r['tier_io']['text']}")
    print(f"  raw side: {r['raw_io']['text']}")
    print(f"  schedule: {r['repeats']} repeats, ABBA: odd [raw W, tier W, raw R, tier R], even "
          f"[tier W, raw W, tier R, raw R], then tier rand W, rand R; each phase moves "
          f"{r['phase_blocks']} blocks, tier and raw on opposite halves of the file")
    print(f"  GiB/s: tier = KV payload ({100 * r['payload_fraction']:.2f}% of its bytes on disk), "
          f"raw = bytes on disk; tier/raw compares equal bytes on disk (raw s / tier s); "
          f"median row: per-column medians (tier/raw: the median of the repeats' ratios)")
    head = ("repeat  first", "tier W", "raw W", "tier/raw", "tier R", "raw R", "tier/raw",
            "rand W", "rand R")
    print(f"{head[0]:<13}" + "".join(f"{h:>9}" for h in head[1:]))
    keys = ("seq_write_gibps", "raw_seq_write_gibps", "seq_write_ratio", "seq_read_gibps",
            "raw_seq_read_gibps", "seq_read_ratio", "rand_write_gibps", "rand_read_gibps")
    for rep in r["per_repeat"]:
        first = "raw" if rep["order"][0].startswith("raw") else "tier"
        print(f"{rep['repeat']:>6}  {first:<5}" + "".join(f"{rep[k]:>9.3f}" for k in keys))
    print(f"{'median':<13}" + "".join(f"{r[k]:>9.3f}" for k in keys))
    print(f"first write into the preallocated file (raw): {r['first_write_gibps']:.3f} GiB/s")
    print(f"round trip bit-exact: {r['verified_bit_exact']}")
    for op, label in (("write", "seq write"), ("read", "seq read ")):
        verdict = "PASS" if r[f"seq_{op}_pass"] else "FAIL"
        print(f"{label} tier/raw: median {r[f'seq_{op}_ratio']:.3f} (min "
              f"{r[f'seq_{op}_ratio_min']:.3f}, max {r[f'seq_{op}_ratio_max']:.3f}, "
              f"{r['repeats']} repeats)  {verdict} (>= {r['target_ratio']:.2f})")


def run(args) -> int:
    existed = os.path.lexists(args.path)
    try:
        result = measure(args)
    finally:
        if not existed and not args.keep and os.path.isfile(args.path):
            os.unlink(args.path)
    print_table(result)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["verified_bit_exact"] else 1
