"""fuse.py against the separate kernels: the product of O (+ residual), RMSNorm, gate-up."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
import fuse
from hifc.layers import triton_fused, triton_gemv
dev = torch.device("cuda")
torch.manual_seed(0)
for m in (2, 4, 16, 25, 32):
    for dt in (torch.bfloat16,):
        x = torch.randn(m, 4096, device=dev, dtype=dt)
        wo = torch.randn(4096, 4096, device=dev, dtype=dt) / 64
        wg = torch.randn(28672, 4096, device=dev, dtype=dt) / 64
        res = torch.randn(m, 4096, device=dev, dtype=dt)
        g = (torch.rand(4096, device=dev) + 0.5).to(dt)
        o = triton_gemv.gemm_rows(x, wo)
        normed, summed = triton_fused.rms_norm(o, g, 1e-5, res)
        ref = triton_gemv.gemm_rows(normed, wg)
        s2, sq = fuse.add_sumsq(x, wo, res)
        y = fuse.norm_sumsq(s2, sq, g, 1e-5, False, wg)
        torch.cuda.synchronize()
        print(m, dt, "summed equal", torch.equal(s2, summed),
              "out max diff", (y.float() - ref.float()).abs().max().item(),
              "rel", ((y.float() - ref.float()).norm() / ref.float().norm()).item(),
              "ulp-equal share", (y == ref).float().mean().item(), flush=True)
