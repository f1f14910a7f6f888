"""What serving costs against the engine alone: one workload through ``hifc bench throughput``
(offline, the engine driven directly) and through ``hifc serve`` + ``hifc bench serve`` (every
token streamed over HTTP), with the server's engine in a process of its own (the default) and
in the server's process (``--no-engine-process``).

    PYTHONPATH=$PWD python3 scripts/gpu_serve_overhead.py [OUTDIR]             # one H200, ~5 min
    PYTHONPATH=$PWD python3 scripts/gpu_serve_overhead.py --variant "engine process" [OUTDIR]
    PYTHONPATH=$PWD python3 scripts/gpu_serve_overhead.py --repeats 2 [OUTDIR]  # ~8 min
    PYTHONPATH=$PWD python3 scripts/gpu_serve_overhead.py --workload 512,1024,256 [OUTDIR]
    PYTHONPATH=$PWD python3 scripts/gpu_serve_overhead.py --device cpu [OUTDIR]  # smoke run

The workload (8B random preset, bf16): 512 requests of 512 random prompt tokens and 256 output
tokens (greedy, EOS ignored; ``--workload`` sets other lengths), all sent at once, at most 256
running (``--max-num-seqs``). Each
server variant starts on a free loopback port, is warmed up with other prompts (``--seed 7``),
then runs the workload from one client process (``--seed 0``) and from four
(``--client-processes 4``, ``--seed 1``: other prompts of the same lengths, since a second run
of the same prompts would hit the prefix cache). Served figures of one configuration differ by
up to ~10% from one server instance to the next, so ``--repeats N`` starts N servers of each
variant, in turns. Prints output tokens per second, each against the offline run, with TTFT
and TPOT; writes OUTDIR/offline.json, OUTDIR/<variant>[-rK]-<N>c.json (hifc bench serve's),
OUTDIR/<variant>[-rK].log (the server's) and OUTDIR/serve-overhead.json (the table). Exit
status 1 if a run failed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hifc.bench.serve import wait_healthy
from hifc.ports import free_port

CLI = [sys.executable, "-m", "hifc.entrypoints.cli"]
GPU = dict(model="random:ds-r1-llama-8b", timeout=420,
           engine=["--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", "256"],
           work=["--input-len", "512", "--output-len", "256", "--num-prompts", "512"])
CPU = dict(model="random:tiny-llama", timeout=120,
           engine=["--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
                   "--max-num-seqs", "32"],
           work=["--input-len", "16", "--output-len", "32", "--num-prompts", "64"])
VARIANTS = {"engine process": [], "engine in the server": ["--no-engine-process"]}
CLIENTS = {1: "0", 4: "1"}  # client processes: the workload's seed


def serve(name: str, flags: list[str], setup: dict, outdir: Path) -> dict[int, dict]:
    """bench serve's results from one server of this variant (``name``: its files' stem),
    by client processes."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = outdir / f"{name.replace(' ', '-')}.log"
    with open(log, "w") as out:
        server = subprocess.Popen(CLI + ["serve", setup["model"], *setup["engine"], *flags,
                                         "--port", str(port)], stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, lambda: server.poll() is not None, setup["timeout"], poll_s=0.5)
        bench = CLI + ["bench", "serve", "--base-url", url, "--dataset", "random",
                       *setup["work"]]
        subprocess.run(bench + ["--num-prompts", "16", "--seed", "7"], check=True,
                       stdout=subprocess.DEVNULL)
        results = {}
        for clients, seed in CLIENTS.items():
            path = outdir / f"{name.replace(' ', '-')}-{clients}c.json"
            subprocess.run(bench + ["--seed", seed, "--client-processes", str(clients),
                                    "--json", str(path)], check=True)
            results[clients] = json.loads(path.read_text())
        return results
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="a server variant to run (repeat for more; default: both)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="servers of each variant, started in turns (default 1)")
    parser.add_argument("--workload", metavar="IN,OUT,N",
                        help="prompt tokens, output tokens and requests instead of the "
                             "device's default (e.g. 512,1024,256)")
    parser.add_argument("outdir", nargs="?", default=f"serve-overhead-{time.strftime('%H%M%S')}")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    setup = GPU if args.device == "cuda" else CPU
    if args.workload:
        try:
            lengths = [int(v) for v in args.workload.split(",")]
        except ValueError:
            lengths = []
        if len(lengths) != 3 or min(lengths) < 1:
            parser.error("--workload takes three positive integers: IN,OUT,N")
        setup = {**setup, "work": [f"--{name}={value}" for name, value in zip(
            ("input-len", "output-len", "num-prompts"), lengths)]}
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    offline_path = outdir / "offline.json"
    subprocess.run(CLI + ["bench", "throughput", "--model", setup["model"], *setup["engine"],
                          "--compare", "none", *setup["work"], "--no-progress", "--json",
                          str(offline_path)], check=True)
    offline = json.loads(offline_path.read_text())["variants"][0]
    rows = [dict(run="offline (bench throughput)",
                 output_tokens_per_s=offline["output_tokens_per_s"], of_offline=1.0)]
    status = 0
    servers = [(repeat, name) for repeat in range(args.repeats)
               for name in args.variant or list(VARIANTS)]
    for repeat, name in servers:
        label = name if args.repeats == 1 else f"{name} r{repeat}"
        try:
            results = serve(label, VARIANTS[name], setup, outdir)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"{label}: {exc}", file=sys.stderr)
            status = 1
            continue
        for clients, result in results.items():
            rows.append(dict(
                run=f"hifc serve, {label}, {clients} client{'s' if clients > 1 else ''}",
                output_tokens_per_s=result["output_tokens_per_s"],
                of_offline=result["output_tokens_per_s"] / rows[0]["output_tokens_per_s"],
                ttft_ms=result["ttft_ms"], tpot_ms=result["tpot_ms"]))
    print(f"\n{'run':49} {'out tok/s':>10} {'x offline':>9} {'TTFT mean':>10} {'TPOT mean':>10}")
    for row in rows:
        ttft, tpot = row.get("ttft_ms", {}), row.get("tpot_ms", {})
        print(f"{row['run']:49} {row['output_tokens_per_s']:10.1f} {row['of_offline']:9.3f} "
              f"{ttft.get('mean', float('nan')):10.1f} {tpot.get('mean', float('nan')):10.2f}")
    (outdir / "serve-overhead.json").write_text(json.dumps(rows, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
