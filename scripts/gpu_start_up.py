"""Engine start-up with empty caches (Triton's kernels, hifc's GEMM choices) and again with
the caches it filled, each in a fresh process, and what the first requests after it compile:
prompts of 5k-33k tokens, then follow-ups of 1-24 new tokens over each one's cached blocks (a
short turn late in a long conversation).

    PYTHONPATH=$PWD python3 scripts/gpu_start_up.py                      # this checkout
    python3 scripts/gpu_start_up.py new=$PWD old=/tmp/old-checkout     # versions side by side

Each version's processes import hifc from its directory (the argument NAME=DIR). Per process
it prints the engine's start-up log lines (GEMM tuning, deferred compiles, graph capture,
the start-up passes) and one JSON line: the engine's build seconds, the graphs' capture
seconds, the compiles during start-up, each follow-up's wall milliseconds, a digest of every
request's greedy tokens (equal across versions that compute the same), the compiles inside
requests and the GEMM tuning's outcomes (shape, rows, torch's path's and the chosen kernel's
us per product).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r'''
import hashlib, json, logging, random, sys, time
logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
from hifc import LLMEngine, SamplingParams
from hifc.layers.triton_jit import kernel_compiles
started = time.perf_counter()
engine = LLMEngine.from_options(sys.argv[1], device="cuda", dtype="bfloat16",
                                kv_cache_gib=float(sys.argv[2]), max_num_seqs=128)
build = time.perf_counter() - started
at_start = len(kernel_compiles())
rng = random.Random(0)
greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
tokens = {}
def run():
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
    return time.perf_counter() - started
vocab = engine.arch.vocab_size
prompts = {n: [rng.randrange(3, vocab) for _ in range(n)] for n in (5000, 9000, 17000, 33000)}
for n, prompt in prompts.items():
    engine.add_request(f"p{n}", prompt, greedy)
first = run()
follow_ups = {}
for n, prompt in prompts.items():
    for new in (1, 3, 12, 24):
        engine.add_request(f"f{n}+{new}", prompt[:n // 16 * 16]
                           + [rng.randrange(3, vocab) for _ in range(new)], greedy)
        follow_ups[f"{n // 16 * 16}+{new}"] = round(run() * 1e3, 1)
inside = kernel_compiles()[at_start:]
print("RESULT " + json.dumps(dict(
    build_s=round(build, 2), capture_s=round(engine.runner.decode_graphs.capture_seconds, 2),
    start_up_compiles=at_start, first_prompts_s=round(first, 2), follow_up_ms=follow_ups,
    tokens=hashlib.sha1(json.dumps(sorted(tokens.items())).encode()).hexdigest()[:12],
    request_compiles=[(round(c.seconds, 2), c.kernel[:70]) for c in inside],
    tuned=[(t.n, t.k, t.rows, round(t.default_us, 2), t.chosen, round(t.chosen_us, 2),
            t.from_file) for t in engine.runner.tuned_projections])))
'''
LOGGED = ("tuned", "deferred", "captured", "warmed up", "started up")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("versions", nargs="*", help="NAME=DIR (default: this checkout)")
    p.add_argument("--model", default="random:ds-r1-llama-8b")
    p.add_argument("--kv-cache-gib", type=float, default=40)
    args = p.parse_args()
    versions = args.versions or [f"this={Path(__file__).resolve().parents[1]}"]
    for version in versions:
        name, _, root = version.partition("=")
        cache = tempfile.mkdtemp(prefix=f"triton-{name}-")
        for run in ("cold", "warm"):
            path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
            # both caches a start-up fills: Triton's kernels and hifc's (the GEMM choices)
            env = dict(os.environ, TRITON_CACHE_DIR=cache, HIFC_CACHE_ROOT=cache,
                       PYTHONPATH=path)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", CHILD, args.model,
                                   str(args.kv_cache_gib)], cwd=root, env=env,
                                  capture_output=True, text=True)
            print(f"== {name}, {run} caches: process {time.perf_counter() - started:.1f} s,"
                  f" exit code {done.returncode}")
            lines = (done.stderr + done.stdout).splitlines()
            for line in lines:
                if line.startswith("LOG ") and any(word in line for word in LOGGED):
                    print("   ", line[4:])
            result = [line[7:] for line in lines if line.startswith("RESULT ")]
            print("   ", result[0] if result else done.stderr[-3000:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
