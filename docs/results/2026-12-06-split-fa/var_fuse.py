"""var.py VARIANT cli-args. VARIANT: base | fuse (the 8B O projection adds the residual and sums
squares; the gate-up projection normalizes its input from them: no RMSNorm launch between)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hifc.layers import linear as L, triton_gemv as TG
from hifc.models import llama

variant = sys.argv[1]
if variant == "fuse":
    import fuse
    plain = L.project_then_norm
    seen = set()

    def project_then_norm(row, x, residual, norm, column):
        m = x.shape[0]
        if (row.tp.size == 1 and row.bias is None and column.bias is None and x.is_cuda
                and TG.usable_rows(x, row.weight) and residual.is_contiguous()
                and not TG.rows_config(row.weight.shape[0], m)["swap"]
                and TG.rows_config(column.weight.shape[0], m)["swap"]
                and column.weight.shape[1] % 512 == 0):
            if m not in seen:
                seen.add(m); print("fused", m, flush=True)
            summed, sumsq = fuse.add_sumsq(x, row.weight, residual)
            y = fuse.norm_sumsq(summed, sumsq, norm.weight, norm.eps, norm.unit_offset,
                                column.weight)
            return column.outputs(y), summed
        return plain(row, x, residual, norm, column)
    llama.project_then_norm = project_then_norm
print("variant", variant, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
