"""Prompt-step projections under sustained load: every kernel option of each 8B shape at 8,192 (and
4,096) rows, round robin while the GPU stays busy, against the same options timed as start-up's
tuning times them. Prints us per product (median of rounds) and the rank of each option."""
import statistics
import sys
import time

import torch

from hifc.layers import gemm_tuning as gt
from hifc.layers import cublaslt

dev = torch.device("cuda")
dt = torch.bfloat16
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
rows_list = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "8192").split(",")]
ROUNDS = 5
COPIES = 4


def main():
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, "cublasLt", cublaslt.version())
    heat_w = torch.randn(28672, 4096, device=dev, dtype=dt)
    heat_x = torch.randn(8192, 4096, device=dev, dtype=dt)
    for m in rows_list:
        for name, (n, k) in SHAPES.items():
            ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(COPIES)]
            x = torch.randn(m, k, device=dev, dtype=dt)
            out = torch.empty(m, n, device=dev, dtype=dt)
            ref = gt.launch(gt.CUBLAS, x, ws[0], None, out).float()
            algos = gt._candidates(m, n, k, dt, False, 0, cublaslt.aligns_of(x, ws[0], out))
            options = [gt.CUBLAS, gt.CUBLASLT, *algos]
            ok = []
            for c in options:
                try:
                    if gt._close(gt.launch(c, x, ws[0], None, out), ref):
                        ok.append(c)
                except cublaslt.CublasLtError:
                    pass
            label = {c: (c if isinstance(c, str) else f"cand {algos.index(c)}") for c in ok}
            # as start-up times them: each option's graph in turn, cuBLAS first
            torch.cuda.synchronize()
            time.sleep(1.0)
            tuned = {c: gt._graph_us(lambda c=c: [gt.launch(c, x, w, None, out) for w in ws],
                                     len(ws)) for c in ok}
            # hot: 1.5 s of gate-up products, then rounds over every option, no idle between
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 1.5:
                for _ in range(10):
                    torch.mm(heat_x, heat_w.t())
                torch.cuda.synchronize()
            hot = {c: [] for c in ok}
            for r in range(ROUNDS):
                order = ok if r % 2 == 0 else ok[::-1]
                marks = []
                for c in order:
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(2):
                        for w in ws:
                            gt.launch(c, x, w, None, out)
                    e.record()
                    marks.append((c, s, e))
                torch.cuda.synchronize()
                for c, s, e in marks:
                    hot[c].append(s.elapsed_time(e) * 1e3 / (2 * len(ws)))
            med = {c: statistics.median(v) for c, v in hot.items()}
            best_t = min(tuned, key=tuned.get)
            best_h = min(med, key=med.get)
            flops = 2 * m * n * k
            print(f"\n{name} [{n}, {k}] x {m} rows, {len(ok)} options; tuning's pick {label[best_t]}"
                  f" ({tuned[best_t]:.1f} us), hot pick {label[best_h]} ({med[best_h]:.1f} us); "
                  f"tuning's pick hot {med[best_t]:.1f} us = {med[best_t] / med[best_h]:.3f}")
            for c in sorted(ok, key=med.get)[:8] + [gt.CUBLAS, gt.CUBLASLT]:
                print(f"  {label[c]:9s} tuned {tuned[c]:8.1f} us  hot {med[c]:8.1f} us "
                      f"({flops / med[c] / 1e6:6.1f} TFLOP/s)  rounds "
                      + " ".join(f"{v:.0f}" for v in hot[c]))
            del ws, x, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
