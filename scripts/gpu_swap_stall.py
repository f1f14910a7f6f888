"""Issue 16, "no swap-out stalls": flash vs DRAM swapping on Table 3's DS-Llama-8B cells and
the swap-heavy GovReport-like run, on one H200, with swap-outs that free their GPU blocks once
staged in host memory and growth-aware resumption.

Usage, repo root:  PYTHONPATH=$PWD python3 scripts/gpu_swap_stall.py [--out DIR]
                       [--model random:ds-r1-qwen-14b] [--variants dram,flash,recompute,auto]
                   PYTHONPATH=$PWD python3 scripts/gpu_swap_stall.py --device cpu   (smoke)

Cells (``hifc bench throughput --compare dram,flash`` each, in this process; the settings of
scripts/gpu_paper_run.sh's table3-8b stage and scripts/gpu_swap_run.sh's govreport run):
  qasper / govreport / narrativeqa  8 prompts, batch 8, KV budget 300 / 700 / 1400 blocks of 64
  swap-heavy                        GovReport-like inputs, 2048 output tokens, 16 prompts,
                                    batch 16, 1400 blocks
about 4-5 minutes on one H200 (the Table 3 cells ~2 min, the swap-heavy run ~2.5 min).

Prints one row per cell: tokens/s of both variants, flash/DRAM against the issue's 0.99
target, preemptions, GiB swapped out, stall seconds spent on a swap-out, the GPU blocks that
flash swap-outs freed once staged (before their writes ended) out of those written, and the
flash tier's staging (host sets, pinned host MiB, GPU work-buffer MiB; ``--flash-staging-mib``
sets the host part). Checks, per
variant: no swap failed and every block swapped out came back; per flash variant that swapped:
its swap-outs freed blocks when staged. Exit status 1 when a check fails (a missed target is
reported, not a failure). JSON per cell under --out (default ./swap_stall_results).
With ``--variants`` naming ``auto`` and fixed policies (``flash`` swaps, ``recompute``), a second
table gives ``auto`` against the best fixed policy of each cell (target within 1%).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from dataclasses import asdict

from hifc.entrypoints.cli import main as hifc_main
from hifc.layers.triton_jit import kernel_compiles

TARGET = 0.99
GPU_MODEL = "random:ds-r1-llama-8b"
CPU_MODEL = "random:tiny-llama"


def cells(smoke: bool) -> dict[str, list[str]]:
    """Cell name -> its workload and budget flags."""
    if smoke:  # tiny-llama caps prompts at 1024 - 40 tokens (62 blocks of 16): the prompts
        # just fit the budgets, their growth (2 blocks each) preempts
        table3 = ["--num-prompts", "2", "--max-num-seqs", "2", "--output-len", "40",
                  "--block-size", "16", "--num-gpu-blocks", "126"]
        return {
            "qasper": ["--profile", "qasper", *table3],
            "govreport": ["--profile", "govreport", *table3],
            "narrativeqa": ["--profile", "narrativeqa", *table3],
            "swap-heavy": ["--profile", "govreport", "--output-len", "40", "--num-prompts", "4",
                           "--max-num-seqs", "4", "--block-size", "16", "--num-gpu-blocks",
                           "250"],
        }
    table3 = ["--num-prompts", "8", "--max-num-seqs", "8"]
    return {
        "qasper": ["--profile", "qasper", "--num-gpu-blocks", "300", *table3],
        "govreport": ["--profile", "govreport", "--num-gpu-blocks", "700", *table3],
        "narrativeqa": ["--profile", "narrativeqa", "--num-gpu-blocks", "1400", *table3],
        "swap-heavy": ["--profile", "govreport", "--output-len", "2048", "--num-prompts", "16",
                       "--max-num-seqs", "16", "--num-gpu-blocks", "1400"],
    }


def run_cell(name: str, flags: list[str], args, flash_path: str) -> dict:
    smoke = args.device == "cpu"
    size = "0.01" if smoke else "8"
    model = CPU_MODEL if smoke else args.model
    out = os.path.join(args.out, f"swap_stall_{model.split(':')[-1]}_{name}.json")
    argv = ["bench", "throughput", "--model", model,
            "--no-progress", "--compare", args.variants, "--swap-space", size,
            "--flash-size-gib", size, "--flash-path", flash_path, "--prefix-store", "off",
            "--json", out, *flags]
    if args.flash_staging_mib is not None:
        argv += ["--flash-staging-mib", str(args.flash_staging_mib)]
    if smoke:
        argv += ["--device", "cpu"]
    print(f"=== {name}: hifc {' '.join(argv)}", flush=True)
    status = hifc_main(argv)
    if status:
        raise SystemExit(f"{name}: hifc bench throughput exited with {status}")
    if os.path.exists(flash_path):
        os.remove(flash_path)
    with open(out) as f:
        return {v["variant"]: v for v in json.load(f)["variants"]}


def check(name: str, variants: dict) -> list[str]:
    """What is wrong with a cell's results (empty: nothing)."""
    problems = []
    for v in variants.values():
        label = f"{name}/{v['variant']}"
        if v["swap_failures"]:
            problems.append(f"{label}: {v['swap_failures']} swaps failed")
        if v["swap_in_blocks"] != v["swap_out_blocks"]:
            problems.append(f"{label}: {v['swap_out_blocks']} blocks out, "
                            f"{v['swap_in_blocks']} back in")
    flash = variants["flash"]
    if flash["swap_out_blocks"] and not flash["swap_out_blocks_freed_staged"]:
        problems.append(f"{name}/flash: swapped out {flash['swap_out_blocks']} blocks but freed "
                        f"none when staged")
    return problems


COLUMNS = ("cell", "dram tok/s", "flash tok/s", "flash/dram", f">= {TARGET}", "preempt d,f",
           "GiB out", "out-stall s d,f", "freed staged/out", "steps d,f",
           "staging sets,host MiB,GPU MiB")


def row(name: str, variants: dict) -> list[str]:
    dram, flash = variants["dram"], variants["flash"]
    ratio = flash["output_tokens_per_s"] / dram["output_tokens_per_s"]
    return [name, f"{dram['output_tokens_per_s']:.1f}", f"{flash['output_tokens_per_s']:.1f}",
            f"{ratio:.3f}", "yes" if ratio >= TARGET else "NO",
            f"{dram['preemptions']},{flash['preemptions']}",
            f"{flash['tier_bytes_written'] / 2**30:.2f}",
            f"{dram['swap_out_stall_seconds']:.2f},{flash['swap_out_stall_seconds']:.2f}",
            f"{flash['swap_out_blocks_freed_staged']}/{flash['swap_out_blocks']}",
            f"{dram['steps']},{flash['steps']}", staging_cell(flash)]


def staging_cell(flash: dict) -> str:
    """The flash tier's staging: host sets, host MiB, GPU (work buffer) MiB."""
    staging = flash.get("tier_staging") or {}
    if not staging:
        return "-"
    return (f"{staging['staging_sets']},{staging['staging_host_bytes'] / 2**20:.0f},"
            f"{staging['staging_work_bytes'] / 2**20:.0f}")


FIXED_POLICIES = ("flash", "recompute")
AUTO_COLUMNS = ("cell", *(f"{v} tok/s" for v in FIXED_POLICIES), "auto tok/s",
                "auto/best fixed", "within 1%", "preempt auto", "recomputed auto")


def auto_row(name: str, variants: dict) -> list[str]:
    """``auto`` against the best of the fixed policies that ran."""
    auto = variants["auto"]
    best = max(variants[v]["output_tokens_per_s"] for v in FIXED_POLICIES if v in variants)
    ratio = auto["output_tokens_per_s"] / best
    return [name, *(f"{variants[v]['output_tokens_per_s']:.1f}" if v in variants else "-"
                    for v in FIXED_POLICIES),
            f"{auto['output_tokens_per_s']:.1f}", f"{ratio:.3f}",
            "yes" if ratio >= 0.99 else "NO", str(auto["preemptions"]),
            str(auto["recomputed_sequences"])]


def print_table(rows: list[list[str]], columns: tuple[str, ...] = COLUMNS) -> None:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke run with tiny settings")
    parser.add_argument("--out", default="swap_stall_results", help="JSON per cell here")
    parser.add_argument("--cells", default="qasper,govreport,narrativeqa,swap-heavy",
                        help="comma-separated subset of the cells")
    parser.add_argument("--model", default=GPU_MODEL, help="the preset (GPU runs)")
    parser.add_argument("--compiles-json",
                        help="write every Triton compilation of the run here (kernel, seconds, "
                             "specialisation), warm-ups included")
    parser.add_argument("--flash-staging-mib", type=int,
                        help="the flash tier's host staging (default: the tier's, 1024 MiB)")
    parser.add_argument("--variants", default="dram,flash",
                        help="hifc bench throughput --compare variants; dram and flash at least")
    args = parser.parse_args()
    if not {"dram", "flash"} <= set(args.variants.split(",")):
        parser.error("--variants must name dram and flash")
    logging.basicConfig(level=logging.WARNING)  # before the CLI's INFO setup: keep it quiet
    os.makedirs(args.out, exist_ok=True)
    todo = cells(args.device == "cpu")
    chosen = [c for c in args.cells.split(",") if c]
    unknown = [c for c in chosen if c not in todo]
    if unknown:
        parser.error(f"unknown cells {unknown}; choose from {', '.join(todo)}")
    flash_dir = tempfile.mkdtemp(prefix="hifc-swapstall-", dir=None if args.device == "cpu"
                                 else os.getcwd())
    flash_path = os.path.join(flash_dir, "kv.hifc")
    rows, auto_rows, problems = [], [], []
    try:
        for name in chosen:
            variants = run_cell(name, todo[name], args, flash_path)
            rows.append(row(name, variants))
            if "auto" in variants:  # flash, a fixed policy, always runs
                auto_rows.append(auto_row(name, variants))
            problems += check(name, variants)
    finally:
        if os.path.exists(flash_path):
            os.remove(flash_path)
        os.rmdir(flash_dir)
    if args.compiles_json:
        with open(args.compiles_json, "w") as f:
            json.dump([asdict(c) for c in kernel_compiles()], f, indent=1)
    print(f"\nflash vs DRAM swap ({'smoke, CPU' if args.device == 'cpu' else args.model}); "
          f"target flash/dram >= {TARGET}")
    print_table(rows)
    if auto_rows:
        print("\nauto preemption vs the best fixed policy (flash swap, recompute)")
        print_table(auto_rows, AUTO_COLUMNS)
    for problem in problems:
        print(f"CHECK FAILED: {problem}")
    print("checks: " + ("FAILED" if problems else "ok (no swap failed, every block came back, "
                                                  "flash swap-outs freed blocks when staged)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
