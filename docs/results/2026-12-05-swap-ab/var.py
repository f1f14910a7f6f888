"""var.py VARIANT BEST_JSON cli-args: VARIANT 'base' (the code as is) or 'swap' (gemm_rows
through the probe's fastest swap-AB configuration per (N, K, row tile) where it beat gemm_rows)."""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hifc.layers import triton_gemv

variant, best_path = sys.argv[1], sys.argv[2]
if variant == "swap":
    import kernels as kv
    best = json.load(open(best_path))
    plain = triton_gemv.gemm_rows
    used = set()

    def gemm_rows(x, weight, bias=None, *, out=None, **_):
        m, k = x.shape
        n = weight.shape[0]
        cfg = best.get(f"{n},{k},{16 if m <= 16 else 32}")
        if bias is not None or cfg is None or cfg["us"] >= cfg["rows_us"]:
            return plain(x, weight, bias, out=out)
        if (n, k, m) not in used:
            used.add((n, k, m)); print("swap", n, k, m, cfg, flush=True)
        c = {key: cfg[key] for key in ("block_n", "block_k", "stages", "warps", "split", "tma")}
        return kv.swap_rows(x, weight, out=out, **c)

    triton_gemv.gemm_rows = gemm_rows
print("variant", variant, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[3:]))
