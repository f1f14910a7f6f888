"""Runs the hifc CLI with every timed run's per-step wall times (ms) appended to $STEPS_OUT."""
import json
import os
import runpy
import sys

import hifc.bench.throughput as throughput

percentiles = throughput.step_percentiles_ms


def dump(step_s):
    with open(os.environ["STEPS_OUT"], "a") as f:
        f.write(json.dumps([round(s * 1e3, 3) for s in step_s]) + "\n")
    return percentiles(step_s)


throughput.step_percentiles_ms = dump
sys.argv = ["hifc"] + sys.argv[1:]
runpy.run_module("hifc.entrypoints.cli", run_name="__main__")
