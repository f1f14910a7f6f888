"""One-shot GPU-machine check of the flash prefix store (run from the repository root).

    PYTHONPATH=$PWD python3 scripts/gpu_prefix_store.py [--sizes 8,32] [--dir DIR]
    PYTHONPATH=$PWD python3 scripts/gpu_prefix_store.py --device cpu      # smoke run, tiny sizes

1. Correctness: the prefix-store tests (tests/tiers/test_tiers_prefix.py) and the GPU ones
   (prefix blocks written from a CUDA KV cache through kvikio and POSIX, found and read back
   bit-exact after a reopen, a corrupted record refused) under pytest.
2. The index rebuild a reopen costs (``hifc bench init --prefix-scan``): for each size and
   block geometry, a cache file is filled with prefix records, then reopened ``--repeat``
   times; the table gives the fill rate, the scan time, the scan per GiB of tier (the target is
   well under 1 s/GiB) and headers per second. The files go to ``--dir`` (they need that much
   free space: the 1-GPU machine has a 64 GiB disk) and are removed afterwards.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from hifc.bench import init as bench_init

GEOMETRIES = {  # name: bench geometry flags
    "8b-16tok": ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--block-size", "16",
                 "--dtype", "bfloat16"],  # DeepSeek-R1-Distill-Llama-8B, 2 MiB blocks
    "smollm2-16tok": ["--layers", "30", "--kv-heads", "3", "--head-dim", "64", "--block-size",
                      "16", "--dtype", "bfloat16"],  # SmolLM2-135M, 480 KiB blocks
}
SMOKE_GEOMETRY = {"tiny": ["--layers", "2", "--kv-heads", "2", "--head-dim", "64",
                           "--block-size", "16"]}


def run_tests() -> bool:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/tiers/test_tiers_prefix.py", "tests/tiers/test_tiers_gpu.py", "-k", "prefix"]
    print("==", " ".join(cmd[2:]), flush=True)
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return done.returncode == 0


def measure(size: str, geometry: list[str], device: str, directory: str, repeat: int) -> dict:
    parser = argparse.ArgumentParser()
    bench_init.register(parser.add_subparsers())
    path = os.path.join(directory, "hifc-prefix-scan.kvc")
    out = os.path.join(directory, "hifc-prefix-scan.json")
    args = parser.parse_args(["init", "--size-gib", size, "--path", path, "--device", device,
                              "--prefix-scan", "--skip-dram", "--repeat", str(repeat),
                              "--json", out, *geometry])
    try:
        args.func(args)
        with open(out) as f:
            return json.load(f)
    finally:
        if os.path.exists(out):
            os.remove(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--sizes", help="tier sizes in GiB (default 8,32; cpu: 0.05)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=".")
    ap.add_argument("--skip-tests", action="store_true")
    opts = ap.parse_args()
    smoke = opts.device == "cpu"
    sizes = (opts.sizes or ("0.05" if smoke else "8,32")).split(",")
    geometries = {**SMOKE_GEOMETRY, "8b-16tok": GEOMETRIES["8b-16tok"]} if smoke else GEOMETRIES
    print(subprocess.run(["df", "-hT", opts.dir], capture_output=True, text=True).stdout)
    tests_ok = True if opts.skip_tests else run_tests()
    rows = []
    for name, flags in geometries.items():
        for size in sizes:
            print(f"== bench init --prefix-scan {size} GiB, {name}", flush=True)
            start = time.perf_counter()
            try:
                r = measure(size, flags, opts.device, opts.dir, opts.repeat)
            except Exception as exc:  # keep going: one size failing must not hide the others
                print(f"   FAILED: {type(exc).__name__}: {exc}")
                rows.append((name, size, None))
                continue
            print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)
            rows.append((name, size, r))
    print(f"\n{'geometry':<15}{'GiB':>7}{'blocks':>9}{'fill GiB/s':>11}{'scan s':>9}"
          f"{'s/GiB':>8}{'hdr/s':>9}{'empty s':>9}{'reopen s':>10}{'records ok':>11}")
    all_ok = tests_ok
    for name, size, r in rows:
        if r is None:
            print(f"{name:<15}{size:>7} error")
            all_ok = False
            continue
        found_all = r["prefix_scan_records"] == r["prefix_records"] == r["num_blocks"]
        all_ok &= found_all
        print(f"{name:<15}{size:>7}{r['num_blocks']:>9}{r['prefix_fill_gibps']:>11.2f}"
              f"{r['prefix_scan_s']:>9.3f}{r['prefix_scan_s_per_gib']:>8.4f}"
              f"{r['prefix_scan_headers_per_s']:>9.0f}{r['prefix_scan_empty_s']:>9.3f}"
              f"{r['prefix_reopen_s']:>10.3f}{str(found_all):>11}")
    print(f"\ntests: {'PASS' if tests_ok else 'FAIL'}   every record indexed after reopen: "
          f"{all(r is not None and r['prefix_scan_records'] == r['num_blocks'] for *_, r in rows)}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
