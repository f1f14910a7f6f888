"""Run the engine fuzz test's cases for many seeds outside pytest, one line per seed; with
``tp2``, each configuration with tensor_parallel_size=2 (asynchronous scheduling off, which
tensor parallelism refuses), against the same one-process reference.

Usage (repo root):
PYTHONPATH=$PWD python docs/results/2026-12-05-fuzz/explore.py FIRST END [ARCH [tp2]]
"""
import pathlib
import random
import sys
import tempfile
import traceback

import tests.engine.test_engine_fuzz as fuzz
from hifc import LLM


class _TmpFactory:
    def mktemp(self, name):
        return pathlib.Path(tempfile.mkdtemp(prefix=name))


def tp2_case(seed, model, reference):
    rng = random.Random(seed)
    cfg = fuzz.random_config(rng, pathlib.Path(tempfile.mkdtemp()))
    work = fuzz.random_workload(rng)
    cfg.update(async_scheduling=False, tensor_parallel_size=2)
    llm = LLM(model, **cfg)
    if cfg.get("tier_fault_injection"):
        fuzz.arm_faults(llm.engine, rng)
    outputs, aborted = fuzz.drive(llm.engine, work, rng)
    fuzz.assert_all_released(llm)
    llm.close()
    fuzz.assert_as_alone(outputs, work, aborted, reference, cfg.get("kv_cache_dtype") != "fp8")


def main():
    models = next(fuzz.models.__wrapped__(_TmpFactory()))
    arch = sys.argv[3] if len(sys.argv) > 3 else "llama"
    tp2 = sys.argv[4:5] == ["tp2"]
    for seed in range(int(sys.argv[1]), int(sys.argv[2])):
        try:
            if tp2:
                tp2_case(seed, *models(arch))
            else:
                fuzz.test_random_configs_and_workloads_give_each_request_its_outputs_alone(
                    arch, seed, models, pathlib.Path(tempfile.mkdtemp()))
            print("seed", seed, "ok", flush=True)
        except Exception as exc:
            print("seed", seed, "FAIL", type(exc).__name__, traceback.format_exc()[-1500:],
                  flush=True)


if __name__ == "__main__":
    main()
