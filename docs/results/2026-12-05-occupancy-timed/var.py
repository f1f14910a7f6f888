"""Variant switches over the working tree's hifc, then the CLI: var.py VARIANT cli-args...
VARIANT: ';'-joined key=value: pdl=KINDS (one-row GEMV kinds launched with PDL, ','-joined of
qkv, o, gateup, down, plain; default o,gateup), stages_KIND=N, maxnreg=N (every one-row GEMV),
attn_maxnreg=N (decode-only attention launches of 16+ segments), attn_ppsm=N
(DECODE_PROGRAMS_PER_SM), rows32=BLOCK_N,BLOCK_K,STAGES (the small-M kernel at 25-32 rows), or
'base'."""
import sys

from hifc.layers import triton_attention, triton_gemv

opts = dict(p.split("=", 1) for p in sys.argv[1].split(";") if p != "base")
pdl_kinds = set(opts.get("pdl", "o,gateup").split(","))
names = {triton_gemv._PLAIN: "plain", triton_gemv._RMS_NORM: "qkv",
         triton_gemv._SILU_MUL: "down", triton_gemv._NORM_SUMSQ: "gateup"}
orig_launch = triton_gemv._launch
orig_kernel = triton_gemv._gemv_kernel


class Extra:
    """A kernel whose launches take extra options."""
    def __init__(self, kernel, extra, when=lambda kw: True):
        self.kernel, self.extra, self.when = kernel, extra, when

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kw):
            if self.when(kw):
                kw.update(self.extra)
            return launch(*args, **kw)
        return run

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def launch(x, weight, bias, out, prologue, **kw):
    kind = "o" if kw.get("add_sumsq") else names[prologue]
    kw["pdl"] = kind in pdl_kinds
    if f"stages_{kind}" in opts:
        kw["stages"] = int(opts[f"stages_{kind}"])
    return orig_launch(x, weight, bias, out, prologue, **kw)


triton_gemv._launch = launch
if "maxnreg" in opts:
    triton_gemv._gemv_kernel = Extra(orig_kernel, dict(maxnreg=int(opts["maxnreg"])))
if "attn_maxnreg" in opts:
    triton_attention._paged_attention_kernel = Extra(
        triton_attention._paged_attention_kernel, dict(maxnreg=int(opts["attn_maxnreg"])),
        lambda kw: kw.get("DECODE_ONLY") and kw.get("NUM_SEGMENTS", 1) >= 16)
if "rows32" in opts:  # block_n,block_k,stages for the small-M kernel's 25-32 rows
    block_n, block_k, stages = map(int, opts["rows32"].split(","))
    orig_config = triton_gemv.rows_config

    def rows_config(n, m=2):
        if m <= 16:
            return orig_config(n, m)
        return dict(block_n=block_n, block_k=block_k, stages=stages, warps=4)
    triton_gemv.rows_config = rows_config
if "attn_ppsm" in opts:
    triton_attention.DECODE_PROGRAMS_PER_SM = int(opts["attn_ppsm"])
print("variant", sys.argv[1], sorted(pdl_kinds), flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
