"""``hifc bench init``: KV tier initialisation time, flash cache file vs pinned DRAM (Table 6).

Times, for a tier of ``--size-gib``: creating the flash cache file (preallocated), reopening it
(matching geometry: only a new epoch is written, so this is O(1) in the size; the prefix store
off), and allocating a zero-filled DRAM pool of the same size, pinned when the KV cache is on a
GPU (what a vLLM-style DRAM swap space costs at start-up). ``--json`` writes ``flash_create_s``,
``flash_reopen_s``, ``dram_alloc_s`` and the ratios.

``--prefix-scan`` also times what the prefix store adds to a reopen: rebuilding its index from
the record headers, once on the empty file and then (``--repeat`` times) after every block of
the file was written as a prefix record (``prefix_scan_s``, ``prefix_scan_s_per_gib``).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import replace

from hifc.analysis.common import positive_float
from hifc.bench.io import add_geometry_args, device_from_args, geometry_from_args


GIB = 1 << 30
FILL_CACHE_BYTES = 256 << 20  # the KV cache the fill writes from


def register(subparsers) -> argparse.ArgumentParser:
    from hifc.tiers.flash.layout import DEFAULT_LAYOUT, LAYOUTS

    p = subparsers.add_parser("init", help="KV tier init time: flash file vs pinned DRAM "
                              "(Table 6)", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=positive_float, required=True, help="tier size")
    p.add_argument("--path", help="cache file to create (must not exist; default: a temporary "
                   "file in the current directory, removed afterwards)")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--layout", default=DEFAULT_LAYOUT, choices=LAYOUTS)
    p.add_argument("--repeat", type=int, default=3, help="reopen timings to take the median of")
    p.add_argument("--skip-dram", action="store_true", help="time the flash tier only")
    p.add_argument("--prefix-scan", action="store_true", help="also fill the file with prefix "
                   "records and time the index rebuild of a reopen (a scan of every header)")
    add_geometry_args(p)
    p.set_defaults(func=run)
    return p


def _timed(build) -> tuple[float, dict]:
    start = time.perf_counter()
    tier = build()
    elapsed = time.perf_counter() - start
    stats = tier.stats()
    tier.close()
    return elapsed, stats


def measure(args, path: str) -> dict:
    from hifc.tiers import TierConfig, make_tier

    if args.repeat < 1:
        raise ValueError("--repeat must be at least 1")
    geometry = geometry_from_args(args)
    device = device_from_args(args)
    flash = TierConfig(kv_offload="flash", flash_path=path, flash_size_gib=args.size_gib,
                       flash_layout=args.layout, prefix_store="off")
    create_s, created = _timed(lambda: make_tier(flash, geometry, device))
    reopen = [_timed(lambda: make_tier(flash, geometry, device)) for _ in range(args.repeat)]
    result = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "size_gib": args.size_gib, "device": device, "layout": args.layout,
        "num_blocks": created["num_blocks"], "file_bytes": created["file_bytes"],
        "flash_create_s": create_s,
        "flash_reopen_s": statistics.median(t for t, _ in reopen),
        "flash_reopen_all_s": [t for t, _ in reopen],
        "reopen_reused_file": all(s["reused_file"] for _, s in reopen),
        "epochs_distinct": len({created["epoch"], *(s["epoch"] for _, s in reopen)})
        == 1 + len(reopen),
    }
    if args.prefix_scan:
        result.update(measure_prefix_scan(replace(flash, prefix_store="evicted"), geometry,
                                          device, args.repeat))
    if not args.skip_dram:
        dram = TierConfig(kv_offload="dram", swap_space=args.size_gib)
        dram_s, dstats = _timed(lambda: make_tier(dram, geometry, device))
        result.update(dram_alloc_s=dram_s, dram_pinned=dstats["pinned"],
                      dram_bytes=dstats["pool_bytes"],
                      dram_vs_flash_reopen=dram_s / result["flash_reopen_s"],
                      dram_vs_flash_create=dram_s / create_s)
    return result


def fill_with_prefix_records(tier, geometry, device) -> int:
    """Write every block of ``tier`` as a prefix record (zero KV, distinct hashes)."""
    import torch

    from hifc.dtypes import torch_dtype

    batch = max(1, min(tier.num_blocks, FILL_CACHE_BYTES // geometry.block_bytes))
    kv = torch.zeros((geometry.num_layers, 2, batch, geometry.block_size,
                      geometry.num_kv_heads, geometry.head_dim),
                     dtype=torch_dtype(geometry.dtype), device=device)
    salt = hashlib.sha256(b"hifc bench init").digest()
    written = 0
    while written < tier.num_blocks:
        n = min(batch, tier.num_blocks - written)
        hashes = [hashlib.sha256(b"block %d" % (written + i)).digest() for i in range(n)]
        job = tier.wait(tier.submit_prefix_write(kv, list(zip(range(n), hashes)), salt))
        if not job.ok or not job.blocks_ok:
            raise RuntimeError(f"filling the cache file failed: {job.error}")
        written += job.blocks_ok
    return written


def measure_prefix_scan(config, geometry, device, repeat: int) -> dict:
    from hifc.tiers import make_tier

    empty_s, empty = _timed(lambda: make_tier(config, geometry, device))
    start = time.perf_counter()
    with make_tier(config, geometry, device) as tier:
        written = fill_with_prefix_records(tier, geometry, device)
    fill_s = time.perf_counter() - start
    reopen = [_timed(lambda: make_tier(config, geometry, device)) for _ in range(repeat)]
    scans = [s["prefix_store_scan_seconds"] for _, s in reopen]
    gib = empty["file_bytes"] / GIB
    return {"prefix_scan_empty_s": empty["prefix_store_scan_seconds"],
            "prefix_reopen_empty_s": empty_s, "prefix_fill_s": fill_s,
            "prefix_fill_gibps": written * geometry.block_bytes / GIB / fill_s,
            "prefix_records": written,
            "prefix_scan_records": min(s["prefix_store_scan_records"] for _, s in reopen),
            "prefix_reopen_s": statistics.median(t for t, _ in reopen),
            "prefix_scan_s": statistics.median(scans), "prefix_scan_all_s": scans,
            "prefix_scan_s_per_gib": statistics.median(scans) / gib,
            "prefix_scan_headers_per_s": empty["num_blocks"] / statistics.median(scans)}


def print_table(r: dict) -> None:
    print(f"hifc bench init: {r['size_gib']} GiB tier ({r['num_blocks']} blocks, "
          f"layout={r['layout']}, device={r['device']})")
    print(f"{'tier':<30}{'seconds':>10}")
    print(f"{'flash: create + preallocate':<30}{r['flash_create_s']:>10.4f}")
    print(f"{'flash: reopen (new epoch)':<30}{r['flash_reopen_s']:>10.4f}")
    if "dram_alloc_s" in r:
        kind = "pinned" if r["dram_pinned"] else "pageable"
        print(f"{'dram: allocate ' + kind:<30}{r['dram_alloc_s']:>10.4f}")
        print(f"dram / flash reopen: {r['dram_vs_flash_reopen']:.1f}x   "
              f"dram / flash create: {r['dram_vs_flash_create']:.2f}x")
    if "prefix_scan_s" in r:
        print(f"{'flash: reopen + index (empty)':<30}{r['prefix_reopen_empty_s']:>10.4f}")
        print(f"{'flash: fill with prefix records':<30}{r['prefix_fill_s']:>10.4f}"
              f"   ({r['prefix_fill_gibps']:.2f} GiB/s)")
        print(f"{'flash: reopen + index (full)':<30}{r['prefix_reopen_s']:>10.4f}")
        print(f"index rebuild: {r['prefix_scan_s']:.4f} s for {r['prefix_scan_records']} records "
              f"= {r['prefix_scan_s_per_gib']:.4f} s/GiB ({r['prefix_scan_headers_per_s']:.0f} "
              f"headers/s); empty file {r['prefix_scan_empty_s']:.4f} s")
    print(f"reopen kept the file: {r['reopen_reused_file']}   "
          f"new epoch each open: {r['epochs_distinct']}")


def run(args) -> int:
    made_dir = None
    if args.path is None:
        made_dir = tempfile.mkdtemp(prefix="hifc-bench-init-", dir=".")
        path = os.path.join(made_dir, "kv.cache")
    elif os.path.lexists(args.path):
        raise ValueError(f"--path {args.path!r} exists; bench init measures creating a new file")
    else:
        path = args.path
    try:
        result = measure(args, path)
    finally:
        if os.path.isfile(path):
            os.unlink(path)
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
    print_table(result)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["reopen_reused_file"] and result["epochs_distinct"] else 1
