"""var2.py VARIANT cli-args: 'base' (the code as is) or 'lt_narrow' (25-32 rows of weights below
SWAP_MIN_N features, the 8B O and down projections, go to cuBLASLt instead of gemm_rows)."""
import sys
from hifc.layers import triton_gemv

variant = sys.argv[1]
if variant == "lt_narrow":
    plain = triton_gemv.usable_rows

    def usable_rows(x, weight):
        if x.dim() == 2 and x.shape[0] > triton_gemv.MAX_ROWS \
                and weight.shape[0] < triton_gemv.SWAP_MIN_N:
            return False
        return plain(x, weight)

    triton_gemv.usable_rows = usable_rows
print("variant", variant, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
