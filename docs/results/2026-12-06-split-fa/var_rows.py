"""var.py VARIANT BEST_JSON cli-args: VARIANT 'base' (the code as is) or 'best' (gemm_rows through
the probe's fastest configuration per (N, K, row tile) where it beat the default)."""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "2026-12-05-swap-ab"))  # its kernels.py
from hifc.layers import triton_gemv

variant, best_path = sys.argv[1], sys.argv[2]
if variant == "best":
    import kernels as kv
    best = json.load(open(best_path))
    plain = triton_gemv.gemm_rows
    used = set()

    def gemm_rows(x, weight, bias=None, *, out=None, **_):
        m, k = x.shape
        n = weight.shape[0]
        b = best.get(f"{n},{k},{16 if m <= 16 else 32}")
        if bias is not None or b is None or b["us"] >= b["rows_us"] * 0.995:
            return plain(x, weight, bias, out=out)
        if (n, k, m) not in used:
            used.add((n, k, m)); print("best", n, k, m, b, flush=True)
        if b["kind"] == "rows":
            return plain(x, weight, out=out, **b["cfg"])
        return kv.swap_rows(x, weight, out=out, **b["cfg"])

    triton_gemv.gemm_rows = gemm_rows
print("variant", variant, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[3:]))
