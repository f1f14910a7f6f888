"""Variants measured in the engine: the one-row GEMV releasing its dependents at its start
(rel), the small-M Triton kernel for 17-32 rows (rows32); then a hifc CLI command."""
import sys

from hifc.layers import triton_gemv

for v in sys.argv[1].split("+"):
    if v == "rel":
        triton_gemv.RELEASE_DEPENDENTS = True
    elif v == "rows32":
        triton_gemv.MAX_ROWS = 32
    elif v != "base":
        raise SystemExit(f"unknown variant {v}")
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
