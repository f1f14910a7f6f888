"""Variant switches over the working tree's hifc, then the CLI: var.py VARIANT cli-args...
VARIANT: kinds of one-row GEMV launched with PDL joined by '+' (plain, rms_norm, silu_mul,
add_sumsq, norm_sumsq), optionally 'pfN' (prefetch N K slices before the wait), or 'base'."""
import sys

from hifc.layers import triton_gemv

parts = sys.argv[1].split("+")
triton_gemv.PDL_GEMVS = frozenset(p for p in parts if not p.startswith("pf") and p != "base")
for p in parts:
    if p.startswith("pf"):
        triton_gemv.PDL_PREFETCH_SLICES = int(p[2:])
print("variant", sorted(triton_gemv.PDL_GEMVS), triton_gemv.PDL_PREFETCH_SLICES, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
