"""var.py VARIANT cli-args. VARIANT: base | nrf (RMSNorm, SiLU-and-mul and rotary kernels
release their dependents before they wait) | nrf_rows (and the small-M kernel and the PDL GEMVs)
| w4, w8 (RMSNorm of <= 64 rows with 4 / 8 warps) | nrf_w4."""
import sys
import torch
from hifc.layers import triton_fused as TF, triton_gemv as TG, triton_pdl as TP

variant = sys.argv[1]
if variant.startswith("nrf"):
    TF.enter = TP.enter_releasing_first
if variant == "nrf_rows":
    TG.enter = TP.enter_releasing_first
if variant.endswith("w4") or variant.endswith("w8"):
    warps_small = int(variant[-1])

    def rms_norm(x, weight, eps, residual=None, unit_offset=False):
        hidden = x.shape[-1]
        x2 = x.reshape(-1, hidden)
        if x2.shape[0] > 64 or x2.stride(-1) != 1:
            return _norm(x, weight, eps, residual, unit_offset)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        out2 = out.view(-1, hidden)
        if residual is None:
            residual2, summed, summed2 = x2, x, x2
        else:
            residual2 = residual.reshape(-1, hidden)
            summed = torch.empty_like(out)
            summed2 = summed.view(-1, hidden)
        block = TF.triton.next_power_of_2(hidden)
        TF._rms_norm_kernel[(x2.shape[0],)](
            x2, residual2, weight, out2, summed2,
            x2.stride(0), residual2.stride(0), out2.stride(0), summed2.stride(0), eps,
            HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None,
            UNIT_OFFSET=unit_offset, **TP.launch_options(x.device),
            num_warps=warps_small, enable_fp_fusion=False)
        return out, summed
    _norm = TF.rms_norm
    TF.rms_norm = rms_norm
print("variant", variant, flush=True)
from hifc.entrypoints.cli import main

sys.exit(main(sys.argv[2:]))
