"""Prototype: the prompt step's gate-up projection with SiLU-and-mul in its epilogue (Triton, TMA,
persistent) against cuBLAS(Lt) + the separate SiLU-and-mul kernel. Prints a table; checks output."""
import itertools
import sys
import time

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.tools.tensor_descriptor import TensorDescriptor

from hifc.layers import triton_fused
from hifc.layers import cublaslt


@triton.jit
def _tile(tile_id, num_m, num_n, GROUP_M: tl.constexpr):
    group = GROUP_M * num_n
    first_m = (tile_id // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group) % size_m
    pid_n = (tile_id % group) // size_m
    return pid_m, pid_n


@triton.jit
def _swiglu_kernel(a_desc, w_desc, o_desc, M, I, K,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   NUM_SMS: tl.constexpr, WS: tl.constexpr, FUSED: tl.constexpr, PRECISE: tl.constexpr = True):
    dtype = o_desc.dtype
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(I, BN)
    k_tiles = tl.cdiv(K, BK)
    num_tiles = num_m * num_n
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True,
                            warp_specialize=WS):
        pid_m, pid_n = _tile(tile_id, num_m, num_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BK
            a = a_desc.load([off_m, off_k])
            g = w_desc.load([off_n, off_k])
            acc_g = tl.dot(a, g.T, acc_g)
            if FUSED:
                u = w_desc.load([I + off_n, off_k])
                acc_u = tl.dot(a, u.T, acc_u)
        if FUSED:
            gf = acc_g.to(dtype).to(tl.float32)
            uf = acc_u.to(dtype).to(tl.float32)
            if PRECISE:
                silu = tl.math.div_rn(gf, 1.0 + libdevice.exp(-gf))
            else:
                silu = gf / (1.0 + tl.exp(-gf))
            out = silu.to(dtype).to(tl.float32) * uf
            o_desc.store([off_m, off_n], out.to(dtype))
        else:
            o_desc.store([off_m, off_n], acc_g.to(dtype))


def launch(x, w, out, BM, BN, BK, stages, warps, ws, fused, group=8):
    M, K = x.shape
    I = out.shape[1]
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    a_desc = TensorDescriptor.from_tensor(x, [BM, BK])
    w_desc = TensorDescriptor.from_tensor(w, [BN, BK])
    o_desc = TensorDescriptor.from_tensor(out, [BM, BN])
    tiles = triton.cdiv(M, BM) * triton.cdiv(I, BN)
    grid = (min(sms, tiles),)
    _swiglu_kernel[grid](a_desc, w_desc, o_desc, M, I, K, BM=BM, BN=BN, BK=BK, GROUP_M=group,
                         NUM_SMS=sms, WS=ws, FUSED=fused, PRECISE=x.is_cuda, num_stages=stages, num_warps=warps,
                         enable_fp_fusion=False)
    return out


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / iters


def main():
    dev = torch.device("cuda")
    dt = torch.bfloat16
    torch.manual_seed(0)
    shapes = [("8B", 14336, 4096), ("32B", 27648, 5120)]
    rows = [int(r) for r in (sys.argv[1] if len(sys.argv) > 1 else "8192,4096,1024").split(",")]
    configs = [  # BM, BN, BK, stages, warps, ws
        (128, 128, 64, 3, 8, False), (128, 128, 64, 4, 8, False), (128, 64, 64, 4, 4, False),
        (128, 128, 64, 3, 8, True), (128, 64, 64, 4, 8, True), (64, 128, 64, 4, 4, False),
        (128, 256, 64, 3, 8, False), (256, 128, 64, 3, 8, False),
    ]
    print(f"{torch.cuda.get_device_name()} triton {triton.__version__} torch {torch.__version__}")
    for (name, inter, hidden), m in itertools.product(shapes, rows):
        w = (torch.randn(2 * inter, hidden, device=dev, dtype=dt) * 0.02).contiguous()
        x = torch.randn(m, hidden, device=dev, dtype=dt)
        flops = 2 * m * 2 * inter * hidden
        res = {}
        ref_gu = torch.mm(x, w.t())
        ref = triton_fused.silu_and_mul(ref_gu)
        iters = max(5, int(2e13 // flops))
        for pref in ("cublas", "cublaslt"):
            with cublaslt.torch_preference(pref):
                gu = torch.empty(m, 2 * inter, device=dev, dtype=dt)
                t_mm = timed(lambda: torch.mm(x, w.t(), out=gu), iters)
                t_all = timed(lambda: triton_fused.silu_and_mul(torch.mm(x, w.t(), out=gu)), iters)
            res[pref] = (t_mm, t_all)
        base = min(v[1] for v in res.values())
        print(f"\n{name} gate-up [{2 * inter}, {hidden}] x {m} rows: {flops / 1e12:.2f} TFLOP, "
              f"{iters} iters")
        for pref, (t_mm, t_all) in res.items():
            print(f"  {pref:9s} mm {t_mm:9.1f} us ({flops / t_mm / 1e6:6.1f} TFLOP/s)  "
                  f"+silu {t_all:9.1f} us  = {t_all / base:.3f}")
        for cfg in configs:
            BM, BN, BK, st, wp, ws = cfg
            out = torch.empty(m, inter, device=dev, dtype=dt)
            try:
                launch(x, w, out, *cfg, fused=True)
                torch.cuda.synchronize()
                diff = (out.float() - ref.float()).abs()
                bad = (diff > 1e-2 * ref.float().abs().max()).sum().item()
                same = (out == ref).float().mean().item()
                t_f = timed(lambda: launch(x, w, out, *cfg, fused=True), iters)
                plain = torch.empty(m, 2 * inter, device=dev, dtype=dt)
                t_p = timed(lambda: launch(x, w, plain, BM, BN, BK, st, wp, ws, False), iters)
                print(f"  {str(cfg):34s} fused {t_f:9.1f} us = {t_f / base:.3f} of best "
                      f"({flops / t_f / 1e6:6.1f} TFLOP/s); plain {t_p:9.1f} us; "
                      f"equal {same:.4f}, off {bad}")
            except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
                print(f"  {str(cfg):34s} failed: {type(e).__name__}: {str(e)[:150]}")
        del w, x
        torch.cuda.empty_cache()
    # sustained: 2 s of each, 8B 8192 rows
    inter, hidden, m = 14336, 4096, 8192
    w = (torch.randn(2 * inter, hidden, device=dev, dtype=dt) * 0.02).contiguous()
    x = torch.randn(m, hidden, device=dev, dtype=dt)
    gu = torch.empty(m, 2 * inter, device=dev, dtype=dt)
    out = torch.empty(m, inter, device=dev, dtype=dt)
    best_cfg = (128, 128, 64, 3, 8, False)
    for label, fn in [
        ("cublaslt+silu", lambda: triton_fused.silu_and_mul(torch.mm(x, w.t(), out=gu))),
        ("fused", lambda: launch(x, w, out, *best_cfg, fused=True)),
        ("cublaslt+silu", lambda: triton_fused.silu_and_mul(torch.mm(x, w.t(), out=gu))),
        ("fused", lambda: launch(x, w, out, *best_cfg, fused=True)),
    ]:
        with cublaslt.torch_preference("cublaslt"):
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < 1.5:
                timed(fn, 20)
                n += 1
            print(f"sustained {label:14s} {timed(fn, 100):9.1f} us after {n * 20} runs")


if __name__ == "__main__":
    main()
