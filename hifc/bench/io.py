"""``hifc bench io``: flash tier bandwidth against raw O_DIRECT on the same file (paper Table 5).

One run, one cache file of ``--size-gib``:

0. precondition: one raw sequential write over the whole file (reported as
   ``first_write_gibps``), so that all phases below overwrite allocated space;
1. sequential write (after one untimed warm-up batch out and in): swap-outs of ``--batch-blocks`` blocks into append-ordered tier blocks
   (adjacent blocks coalesced into I/Os of up to ``--chunk-mib``);
2. sequential read: swap-ins of the same blocks, every record verified;
3. random write / random read: the same volume with the tier blocks shuffled, so every block is
   its own I/O at a random offset (block-sized I/O);
4. a bit-exactness check of one batch;
5. raw baseline: the tier closed, the same byte count written then read sequentially through a
   plain O_DIRECT descriptor on the same file, in ``--chunk-mib`` I/Os from ``--threads`` threads.

GiB/s count KV payload bytes (the tier) or bytes on disk (raw). The table ends with the tier/raw
ratio of the sequential phases. ``--json`` writes ``seq_write_gibps``, ``seq_read_gibps``,
``rand_write_gibps``, ``rand_read_gibps``, ``raw_seq_write_gibps``, ``raw_seq_read_gibps`` and the
run's settings, including whether O_DIRECT was in effect.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import random
import time

GIB = 1 << 30


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
    from hifc.tiers.layout import KVGeometry
    return KVGeometry(args.layers, args.kv_heads, args.head_dim, args.block_size, args.dtype)


def device_from_args(args) -> str:
    import torch
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return args.device


def register(subparsers) -> argparse.ArgumentParser:
    from hifc.tiers.flash import BACKENDS
    from hifc.tiers.layout import DEFAULT_LAYOUT, LAYOUTS

    p = subparsers.add_parser("io", help="flash tier I/O bandwidth vs raw O_DIRECT (Table 5)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--path", required=True, help="cache file to create (or reuse)")
    p.add_argument("--size-gib", type=float, required=True, help="cache file size")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--layout", default=DEFAULT_LAYOUT, choices=LAYOUTS)
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--threads", type=int, default=8, help="I/O threads (tier and raw)")
    p.add_argument("--chunk-mib", type=int, default=32, help="largest coalesced I/O")
    p.add_argument("--batch-blocks", type=int, default=32, help="blocks per swap job")
    p.add_argument("--no-direct", action="store_true", help="buffered I/O instead of O_DIRECT")
    p.add_argument("--keep", action="store_true", help="keep a cache file this run created")
    add_geometry_args(p)
    p.set_defaults(func=run)
    return p


def _timed_jobs(tier, submit, batches) -> float:
    start = time.perf_counter()
    jobs = [submit(batch) for batch in batches]
    for job in jobs:
        tier.wait(job)
    elapsed = time.perf_counter() - start
    failed = [job for job in jobs if not job.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} swap jobs failed; first: {failed[0].error}")
    return elapsed


def _tier_phases(tier, kv, batch: int, seed: int) -> dict:
    n = tier.num_blocks
    owner = (1, 0)
    out = {}
    for pattern in ("seq", "rand"):
        ids = tier.reserve(n)
        if pattern == "seq":  # warm-up, untimed: first-use costs (kvikio's thread pool and
            warm = ids[:batch]  # bounce buffers) are not steady-state bandwidth
            _timed_jobs(tier, lambda b: tier.submit_swap_out(kv, list(zip(range(len(b)), b)),
                                                             owner), [warm])
            _timed_jobs(tier, lambda b: tier.submit_swap_in(kv, list(zip(b, range(len(b)))),
                                                            owner), [warm])
        if pattern == "rand":
            random.Random(seed).shuffle(ids)
        batches = [ids[i:i + batch] for i in range(0, n, batch)]
        out[f"{pattern}_write_s"] = _timed_jobs(
            tier, lambda b: tier.submit_swap_out(kv, list(zip(range(len(b)), b)), owner), batches)
        out[f"{pattern}_read_s"] = _timed_jobs(
            tier, lambda b: tier.submit_swap_in(kv, list(zip(b, range(len(b)))), owner), batches)
        if pattern == "rand":
            out["verified"] = _check_exact(tier, kv, ids[:batch], owner)
        tier.free(ids)
    return out


def _check_exact(tier, kv, first_batch, owner) -> bool:
    """Tier block first_batch[i] holds kv block i (written by the first random batch)."""
    import torch
    expect = kv.clone()
    kv.zero_()
    job = tier.wait(tier.submit_swap_in(kv, list(zip(first_batch, range(len(first_batch)))),
                                        owner))
    return job.ok and torch.equal(kv[:, :, :len(first_batch)], expect[:, :, :len(first_batch)])


def raw_sequential(path: str, offset: int, nbytes: int, io_bytes: int, threads: int,
                   want_direct: bool, ops=("write", "read"), prefix: str = "raw_seq") -> dict:
    """Plain O_DIRECT sequential write and/or read of ``nbytes`` from ``offset`` in the file;
    returns ``{prefix}_{op}_s`` timings."""
    import torch

    from hifc.tiers.io_base import aligned_empty, host_view
    from hifc.tiers.posix_io import open_data_fd

    control = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    fd, direct, note = open_data_fd(control, path, want_direct)
    try:
        buffers = [aligned_empty(io_bytes, torch.device("cpu")) for _ in range(threads)]
        for b in buffers:
            b.copy_(torch.randint(0, 256, (io_bytes,), dtype=torch.uint8))
        extents = [(at, min(io_bytes, offset + nbytes - at))
                   for at in range(offset, offset + nbytes, io_bytes)]

        def transfer(op, i: int) -> None:
            at, length = extents[i]
            view = host_view(buffers[i % threads][:length])
            if op(fd, [view], at) != length:
                raise OSError(f"raw {op.__name__} short at offset {at}")

        out = {"raw_direct_io": direct, "raw_note": note, "raw_bytes": nbytes}
        calls = {"write": os.pwritev, "read": os.preadv}
        with cf.ThreadPoolExecutor(threads) as pool:
            for name in ops:
                start = time.perf_counter()
                list(pool.map(lambda i: transfer(calls[name], i), range(len(extents))))
                out[f"{prefix}_{name}_s"] = time.perf_counter() - start
        return out
    finally:
        os.close(fd)
        os.close(control)


def measure(args) -> dict:
    import torch

    from hifc.tiers import TierConfig, make_tier

    geometry = geometry_from_args(args)
    device = device_from_args(args)
    if args.batch_blocks < 1 or args.threads < 1 or args.chunk_mib < 1:
        raise ValueError("--batch-blocks, --threads and --chunk-mib must be positive")
    config = TierConfig(kind="flash", path=args.path, size_gib=args.size_gib, layout=args.layout,
                        backend=args.backend, io_threads=args.threads, chunk_mib=args.chunk_mib,
                        direct_io=not args.no_direct)
    tier = make_tier(config, geometry, device)
    io_bytes = args.chunk_mib << 20
    try:
        # Precondition: write the whole data area once, so that every phase (tier and raw)
        # overwrites allocated blocks; the first write into freshly preallocated (unwritten)
        # extents costs the file system extra metadata work and is reported on its own.
        data_bytes = tier.layout.file_bytes - 4096
        first = raw_sequential(args.path, 4096, data_bytes, io_bytes, args.threads,
                               not args.no_direct, ops=("write",), prefix="first")
        batch = min(args.batch_blocks, tier.num_blocks)
        shape = (geometry.num_layers, 2, batch, geometry.block_size, geometry.num_kv_heads,
                 geometry.head_dim)
        dtype = getattr(torch, geometry.dtype)
        kv = torch.randn(shape, dtype=torch.float32, device=device).to(dtype)
        stats = tier.stats()
        phases = _tier_phases(tier, kv, batch, seed=0)
    finally:
        tier.close()
    layout = tier.layout
    payload = tier.num_blocks * geometry.block_bytes
    raw = raw_sequential(args.path, 4096, data_bytes, io_bytes, args.threads, not args.no_direct)
    result = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "path": args.path, "size_gib": args.size_gib, "device": device,
        "backend": stats["backend"], "layout": layout.name, "direct_io": stats["direct_io"],
        "io_notes": stats["io_notes"], "threads": args.threads, "chunk_mib": args.chunk_mib,
        "batch_blocks": batch, "num_blocks": tier.num_blocks, "block_bytes": geometry.block_bytes,
        "slice_bytes": geometry.slice_bytes, "payload_bytes": payload,
        "geometry": {"layers": geometry.num_layers, "kv_heads": geometry.num_kv_heads,
                     "head_dim": geometry.head_dim, "block_size": geometry.block_size,
                     "dtype": geometry.dtype},
        "verified_bit_exact": phases["verified"],
    }
    for key in ("seq_write", "seq_read", "rand_write", "rand_read"):
        result[f"{key}_s"] = phases[f"{key}_s"]
        result[f"{key}_gibps"] = payload / GIB / phases[f"{key}_s"]
    result.update(raw)
    result["first_write_gibps"] = first["raw_bytes"] / GIB / first["first_write_s"]
    for key in ("write", "read"):
        result[f"raw_seq_{key}_gibps"] = raw["raw_bytes"] / GIB / raw[f"raw_seq_{key}_s"]
        result[f"seq_{key}_vs_raw"] = result[f"seq_{key}_gibps"] / result[f"raw_seq_{key}_gibps"]
        result[f"rand_{key}_vs_raw"] = (result[f"rand_{key}_gibps"]
                                        / result[f"raw_seq_{key}_gibps"])
    return result


def print_table(r: dict) -> None:
    print(f"hifc bench io: {r['path']}  {r['num_blocks']} blocks x {r['block_bytes'] / 2**20:.2f}"
          f" MiB  layout={r['layout']}  backend={r['backend']}  device={r['device']}  "
          f"threads={r['threads']}  chunk={r['chunk_mib']} MiB  batch={r['batch_blocks']}")
    for note in r["io_notes"] + [f"raw: {r['raw_note']}"]:
        print(f"  note: {note}")
    if not (r["direct_io"] and r["raw_direct_io"]):
        print("  WARNING: O_DIRECT not in effect; numbers include the page cache")
    print(f"{'phase':<12}{'tier GiB/s':>12}{'raw GiB/s':>12}{'tier/raw':>10}")
    for key in ("write", "read"):
        for pattern in ("seq", "rand"):
            print(f"{pattern + ' ' + key:<12}{r[f'{pattern}_{key}_gibps']:>12.3f}"
                  f"{r[f'raw_seq_{key}_gibps']:>12.3f}{r[f'{pattern}_{key}_vs_raw']:>10.3f}")
    print(f"first write into the preallocated file (raw): {r['first_write_gibps']:.3f} GiB/s")
    print(f"round trip bit-exact: {r['verified_bit_exact']}")


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
