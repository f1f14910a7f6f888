"""var.py VARIANT cli-args: timing ablations of a decode step's elementwise kernels (outputs are
wrong; timing only). VARIANT: base | nonorm (RMSNorm kernels of <= 64 rows skipped) | nosilu
(SiLU-and-mul of <= 64 rows skipped: the down projection reads the gate half) | neither."""
import sys
from hifc.layers import triton_fused as TF

variant = sys.argv[1]
if variant in ("nonorm", "neither"):
    _norm = TF.rms_norm

    def rms_norm(x, weight, eps, residual=None, unit_offset=False):
        if x.reshape(-1, x.shape[-1]).shape[0] > 64:
            return _norm(x, weight, eps, residual, unit_offset)
        return x, (x if residual is None else residual)
    TF.rms_norm = rms_norm
if variant in ("nosilu", "neither"):
    _silu = TF.silu_and_mul

    def silu_and_mul(gate_up):
        if gate_up.reshape(-1, gate_up.shape[-1]).shape[0] > 64:
            return _silu(gate_up)
        return gate_up[..., : gate_up.shape[-1] // 2]
    TF.silu_and_mul = silu_and_mul
print("variant", variant, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
