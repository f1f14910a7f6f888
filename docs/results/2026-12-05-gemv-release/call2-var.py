"""Variants measured in the engine, then a hifc CLI command (argv after the variant):
rel (the one-row GEMV releases its dependents at its start), r32 (the small-M kernel for 17-32
rows), nosilu / nofuse (SiLU, or SiLU and the add-then-norm, fused for one row only)."""
import sys

from hifc.layers import triton_gemv

for v in sys.argv[1].split("+"):
    if v == "rel":
        triton_gemv.RELEASE_DEPENDENTS = True
    elif v == "r32":
        triton_gemv.MAX_ROWS = 32
    elif v in ("nosilu", "nofuse"):
        one = triton_gemv.usable_silu_mul
        triton_gemv.usable_silu_mul = lambda g, w, _f=one: g.shape[0] == 1 and _f(g, w)
        if v == "nofuse":
            add = triton_gemv.usable_add_sumsq
            triton_gemv.usable_add_sumsq = lambda x, r, w, _f=add: x.shape[0] == 1 and _f(x, r, w)
    elif v not in ("base", "new"):
        raise SystemExit(f"unknown variant {v}")
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
