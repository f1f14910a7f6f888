"""Run the engine fuzz test's cases for many seeds outside pytest, one line per seed; with
``tp2`` or ``dp2`` (Llama only), the test's cases with tensor_parallel_size=2 or
data_parallel_size=2.

Usage (repo root):
PYTHONPATH=$PWD python docs/results/2026-12-05-fuzz/explore.py FIRST END [ARCH [tp2|dp2]]
"""
import pathlib
import sys
import tempfile
import traceback

import tests.engine.test_engine_fuzz as fuzz


class _TmpFactory:
    def mktemp(self, name):
        return pathlib.Path(tempfile.mkdtemp(prefix=name))


def main():
    models = next(fuzz.models.__wrapped__(_TmpFactory()))
    arch = sys.argv[3] if len(sys.argv) > 3 else "llama"
    mode = sys.argv[4] if len(sys.argv) > 4 else None
    for seed in range(int(sys.argv[1]), int(sys.argv[2])):
        try:
            if mode in ("tp2", "dp2"):
                fuzz.test_random_configs_with_tensor_or_data_parallelism(
                    mode, seed, models, pathlib.Path(tempfile.mkdtemp()))
            else:
                fuzz.test_random_configs_and_workloads_give_each_request_its_outputs_alone(
                    arch, seed, models, pathlib.Path(tempfile.mkdtemp()))
            print("seed", seed, "ok", flush=True)
        except Exception as exc:
            print("seed", seed, "FAIL", type(exc).__name__, traceback.format_exc()[-1500:],
                  flush=True)


if __name__ == "__main__":
    main()
