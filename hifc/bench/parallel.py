"""``hifc bench parallel``: the paper's GPU:SSD topologies (Table 2), one GPU against
data-parallel replicas that share one flash device, with and without the device arbiter.

Variants are named ``dp<N>-<tier>[-arbiter]``: N replicas (one per GPU, replica i on
``cuda:i``), preemption swapping to pinned DRAM (``dram``) or to flash (``flash``);
``-arbiter`` turns the flash device arbiter on (without it the replicas' I/O meets only in the
device queue). ``--flash-path`` names each replica's file (a ``{replica}`` template or a list):
files in one directory share a device (the paper's 2:1), files on separate devices do not
(2:2); the table's ``topo`` column says which ran. Each replica gets ``--num-prompts``
requests (a ``dpN`` variant runs N times as many, drawn from one workload), so every GPU sees
the load and swap pressure of the single-GPU run.

Per variant: output tokens/s, in all and per GPU; the ratio to the same tier on one GPU
(target: >= 1.9 at two GPUs); each GPU's flash/DRAM ratio (replica i of ``dpN-flash*`` against
replica i of ``dpN-dram``); the swap stall (steps waiting for swap I/O, summed over replicas)
and its swap-out part; and, where an arbiter ran, how long swap-ins and swap-outs waited for
admission and the device's measured rate. Variants needing more GPUs than are visible are
skipped, with a note.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass

from hifc.bench.probes import free_device_memory
from hifc.bench.throughput import (add_workload_args, build_workload, check_workload_args,
                                   engine_settings, run_variant, variant_options)
from hifc.config import EngineConfig, add_engine_args, engine_config_from_args
from hifc.parallel.config import replica_flash_paths
from hifc.parallel.devices import flash_device_of

DEFAULT_VARIANTS = "dp1-dram,dp1-flash,dp2-dram,dp2-flash,dp2-flash-arbiter"
_NAME = re.compile(r"dp([1-9][0-9]*)-(dram|flash)(-arbiter)?")


@dataclass(frozen=True)
class Topology:
    name: str
    replicas: int
    tier: str  # "dram" | "flash"
    arbiter: bool


def parse_topologies(text: str) -> list[Topology]:
    out = []
    for name in (v.strip() for v in text.split(",") if v.strip()):
        match = _NAME.fullmatch(name)
        if match is None:
            raise ValueError(f"unknown variant {name!r}: dp<N>-dram, dp<N>-flash or "
                             "dp<N>-flash-arbiter (N replicas, one per GPU)")
        replicas, tier, arbiter = int(match[1]), match[2], bool(match[3])
        if arbiter and replicas < 2:
            raise ValueError(f"{name}: an arbiter shares a device among replicas; use N >= 2")
        out.append(Topology(name, replicas, tier, arbiter))
    if not out or len({t.name for t in out}) != len(out):
        raise ValueError(f"--variants needs distinct variants, got {text!r}")
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("parallel", help="GPU:SSD topologies: one GPU vs data-parallel "
                              "replicas sharing a flash device, arbiter on and off (Table 2)")
    add_workload_args(p, num_prompts_help="requests per replica")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help="comma-separated dp<N>-dram, dp<N>-flash, dp<N>-flash-arbiter "
                        f"(default {DEFAULT_VARIANTS})")
    p.add_argument("--json", dest="json_out", help="write results as JSON here")
    p.add_argument("--no-progress", action="store_true")
    add_engine_args(p, model="random:ds-r1-llama-8b")
    p.set_defaults(func=run)


def visible_gpus(base: dict) -> int | None:
    """GPUs the replicas would use, or None when they run on the CPU."""
    import torch

    from hifc.parallel.devices import replica_devices
    config = EngineConfig.from_options(**base)
    if replica_devices(config)[0] == "cpu":
        return None
    return torch.cuda.device_count()


def topology_options(t: Topology, base: dict) -> dict:
    return {**variant_options(t.tier, base), "data_parallel_size": t.replicas,
            "flash_arbiter": t.arbiter}


def run(args: argparse.Namespace) -> int:
    from hifc.parallel.data_parallel import build_engine

    check_workload_args(args)
    topologies = parse_topologies(args.variants)
    base = engine_config_from_args(args).options()
    base.pop("data_parallel_size", None)
    for t in topologies:
        EngineConfig.from_options(**topology_options(t, base))  # bad options fail up front
    gpus = visible_gpus(base)
    runnable = [t for t in topologies if gpus is None or t.replicas <= gpus]
    skipped = [t.name for t in topologies if t not in runnable]
    if skipped:
        print(f"only {gpus} GPU(s) visible: skipping {', '.join(skipped)} "
              "(one GPU per replica)")
    if not runnable:
        return 1
    per_replica = args.num_prompts
    workload_args = argparse.Namespace(**{**vars(args), "num_prompts": per_replica * max(
        t.replicas for t in runnable)})
    requests, workload, results = None, None, []
    summary = {}
    for t in runnable:
        engine = build_engine(EngineConfig.from_options(**topology_options(t, base)))
        try:
            if requests is None:
                requests, workload = build_workload(workload_args, engine)
            result = run_variant(engine, t.name, requests[:per_replica * t.replicas],
                                 not args.no_progress)
        finally:
            engine.close()
            del engine
            free_device_memory()
        results.append({**asdict(t), **result, "flash_disks": flash_disks(t, base)})
        summary = summarize(results, workload, engine_settings(base), gpus, skipped,
                            per_replica)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(summary, f, indent=2)
    print_table(summary, args.model)
    return 0


def flash_disks(t: Topology, base: dict) -> int | None:
    """How many devices hold the replicas' flash files (None for DRAM)."""
    if t.tier != "flash":
        return None
    paths = replica_flash_paths(base["flash_path"], t.replicas)
    return len({flash_device_of(p)[0] for p in paths})


def summarize(results: list[dict], workload: dict, settings: dict, gpus: int | None,
              skipped: list[str], per_replica: int) -> dict:
    by_name = {r["variant"]: r for r in results}
    for r in results:
        r["per_gpu_tokens_per_s"] = [p["generation_tokens"] / r["elapsed_s"]
                                     for p in r["per_replica"]]
        one = by_name.get(f"dp1-{r['tier']}")
        r["ratio_to_one_gpu"] = (r["output_tokens_per_s"] / one["output_tokens_per_s"]
                                 if one else None)
        dram = by_name.get(f"dp{r['replicas']}-dram")
        r["flash_to_dram_per_gpu"] = (
            [f / d for f, d in zip(r["per_gpu_tokens_per_s"], dram["per_gpu_tokens_per_s"])]
            if r["tier"] == "flash" and dram else None)
    return {"variants": results, "workload": workload, "settings": settings,
            "requests_per_replica": per_replica, "gpus_visible": gpus, "skipped": skipped}


def _ratios(values: list[float] | None) -> str:
    return "-" if values is None else "/".join(f"{v:.3f}" for v in values)


def _waits(r: dict, key: str) -> str:
    devices = r["flash_devices"]
    return f"{sum(d[key] for d in devices):.2f}" if devices else "-"


def _device_rate(r: dict) -> str:
    rates = [d["measured_gibps"] for d in r["flash_devices"] if d["measured_gibps"]]
    return "/".join(f"{x:.2f}" for x in rates) if rates else "-"


# header -> (width, cell text)
_CELLS = {
    "variant": (18, lambda r: r["variant"]),
    "topo": (5, lambda r: f"{r['replicas']}:{r['flash_disks']}" if r["flash_disks"] else "-"),
    "out tok/s": (10, lambda r: f"{r['output_tokens_per_s']:.1f}"),
    "per GPU tok/s": (17, lambda r: "/".join(f"{v:.0f}" for v in r["per_gpu_tokens_per_s"])),
    "x 1 GPU": (7, lambda r: "-" if r["ratio_to_one_gpu"] is None
                else f"{r['ratio_to_one_gpu']:.3f}"),
    "flash/dram per GPU": (18, lambda r: _ratios(r["flash_to_dram_per_gpu"])),
    "preempt": (7, lambda r: r["preemptions"]),
    "swap out": (8, lambda r: r["swap_out_blocks"]),
    "stall s": (7, lambda r: f"{r['swap_stall_seconds']:.2f}"),
    "of it out": (9, lambda r: f"{r['swap_out_stall_seconds']:.2f}"),
    "arb in wait s": (13, lambda r: _waits(r, "swap_in_wait_seconds")),
    "arb out wait s": (14, lambda r: _waits(r, "swap_out_wait_seconds")),
    "dev GiB/s": (9, _device_rate),
}


def print_table(summary: dict, model: str) -> None:
    s = summary["settings"]
    w = summary["workload"]
    print(f"model {model}  {summary['requests_per_replica']} requests per replica  input mean "
          f"{w['input_tokens_mean']:.0f} / output mean {w['output_tokens_mean']:.0f} tokens  "
          f"max_num_seqs {s['max_num_seqs']}  block {s['block_size']}")
    print(" ".join(f"{name:>{width}}" for name, (width, _) in _CELLS.items()))
    for r in summary["variants"]:
        print(" ".join(f"{cell(r):>{width}}" for width, cell in _CELLS.values()))
