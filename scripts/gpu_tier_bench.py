"""One-shot GPU-machine benchmark of the flash tier (run by hand on the device, from the
repository root).

    PYTHONPATH=. python3 scripts/gpu_tier_bench.py [--size-gib 4] [--dir DIR] [--out OUT]

Runs ``hifc bench io`` (``--repeats`` interleaved raw/tier repeats each) for kvikio and POSIX
backends, both layouts, on a GPU KV cache (and one CPU KV cache run), then ``hifc bench init`` at
two sizes, and writes everything to ``OUT/results.json`` with a summary table on stdout: median
GiB/s per phase and the median (min-max) of the per-repeat tier/raw ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

from hifc.bench import init as bench_init
from hifc.bench import io as bench_io

IO_RUNS = [
    ("kvikio/block-record/cuda", ["--backend", "kvikio", "--layout", "block-record"]),
    ("kvikio/layer-kv/cuda", ["--backend", "kvikio", "--layout", "layer-kv"]),
    ("posix/block-record/cuda", ["--backend", "posix", "--layout", "block-record"]),
    ("posix/layer-kv/cuda", ["--backend", "posix", "--layout", "layer-kv"]),
    ("posix/block-record/cpu", ["--backend", "posix", "--layout", "block-record",
                                "--device", "cpu"]),
]


def parse(argv):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    bench_io.register(sub)
    bench_init.register(sub)
    return parser.parse_args(argv)


def save(results: dict, out: str) -> None:
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", default="4")
    ap.add_argument("--init-sizes", default="8,32")
    ap.add_argument("--threads", default="8")
    ap.add_argument("--repeats", default="5")
    ap.add_argument("--dir", default=".")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--runs", default="", help="comma-separated substrings selecting io runs")
    opts = ap.parse_args()
    print(subprocess.run(["df", "-hT", opts.dir, "/tmp"], capture_output=True, text=True).stdout)
    results = {"io": {}, "init": {}}
    wanted = [w for w in opts.runs.split(",") if w]
    for name, extra in IO_RUNS:
        if wanted and not any(w in name for w in wanted):
            continue
        print(f"== bench io {name}", flush=True)
        start = time.perf_counter()
        path = os.path.join(opts.dir, "hifc-bench-io.kvc")
        argv = ["io", "--path", path, "--size-gib", opts.size_gib, "--threads", opts.threads,
                "--repeats", opts.repeats,
                "--json", os.path.join(opts.out, "last.json"), *extra]
        if "--device" not in extra:
            argv += ["--device", "cuda"]
        try:
            args = parse(argv)
            args.func(args)
            with open(os.path.join(opts.out, "last.json")) as f:
                results["io"][name] = json.load(f)
        except Exception as exc:  # keep going: one backend failing must not hide the others
            print(f"   FAILED: {type(exc).__name__}: {exc}")
            results["io"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)
        save(results, opts.out)
    for size in [x for x in opts.init_sizes.split(",") if x]:
        print(f"== bench init {size} GiB", flush=True)
        path = os.path.join(opts.dir, "hifc-bench-init.kvc")
        argv = ["init", "--size-gib", size, "--path", path, "--device", "cuda",
                "--json", os.path.join(opts.out, "last.json")]
        try:
            args = parse(argv)
            args.func(args)
            with open(os.path.join(opts.out, "last.json")) as f:
                results["init"][size] = json.load(f)
        except Exception as exc:
            print(f"   FAILED: {type(exc).__name__}: {exc}")
            results["init"][size] = {"error": f"{type(exc).__name__}: {exc}"}
        save(results, opts.out)
    if os.path.exists(os.path.join(opts.out, "last.json")):
        os.remove(os.path.join(opts.out, "last.json"))
    print(f"\n{'run':<26}{'seqW':>7}{'seqR':>7}{'rndW':>7}{'rndR':>7}{'rawW':>7}{'rawR':>7}"
          f"{'W/raw (min-max)':>19}{'R/raw (min-max)':>19}  exact")
    for name, r in results["io"].items():
        if "error" in r:
            print(f"{name:<26} error")
            continue
        ratios = "".join(f"{r[f'seq_{op}_ratio']:>7.3f} ({r[f'seq_{op}_ratio_min']:.2f}-"
                         f"{r[f'seq_{op}_ratio_max']:.2f})" for op in ("write", "read"))
        print(f"{name:<26}" + "".join(f"{r[k]:>7.2f}" for k in (
            "seq_write_gibps", "seq_read_gibps", "rand_write_gibps", "rand_read_gibps",
            "raw_seq_write_gibps", "raw_seq_read_gibps")) + ratios
            + f"  {r['verified_bit_exact']}")


if __name__ == "__main__":
    main()
