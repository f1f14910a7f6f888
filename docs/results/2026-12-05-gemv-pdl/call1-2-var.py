"""Variant switches over the working tree's hifc, then the CLI: var.py VARIANT cli-args..."""
import sys

from hifc.layers import triton_gemv

variant = sys.argv[1]
if "nopf" in variant:  # no L2 prefetch before a GEMV's norm prologue
    triton_gemv.PROLOGUE_PREFETCH = False
if "nogate" in variant:  # SiLU-and-mul as its own kernel after the gate-up rows kernel
    triton_gemv.usable_rows_silu_mul = lambda x, w: False
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
