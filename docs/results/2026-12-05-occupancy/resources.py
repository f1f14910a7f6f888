"""Registers, spills and shared memory of the 8B preset's decode-chain Triton kernels, compiled
for sm_90 on a machine without a GPU (Triton's ptxas and cuobjdump), and how many programs of
each an SM holds. Run from the repository root: python3 docs/results/2026-12-05-occupancy/resources.py"""
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from hifc.layers import triton_gemv as g  # noqa: E402
from hifc.layers.triton_attention import (_merge_segments_kernel, _paged_attention_kernel,  # noqa: E402
                                          merges_in_launch, plan_launch, rotates_in_launch)
from tests.layers.test_triton_compile_fp8 import (compile_hopper, paged_attention_constexprs,  # noqa: E402
                                                  paged_attention_signature)
from tests.layers.test_triton_occupancy import cubin_resources, programs_per_sm  # noqa: E402

SMS = 132
HIDDEN, QKV, INTER, VOCAB = 4096, 6144, 14336, 128256
tmp = Path(tempfile.mkdtemp())


def report(name, kernel, warps, grid):
    used = cubin_resources(kernel, tmp)
    per = programs_per_sm(used["regs"], used["shared"], warps)
    print("%-44s regs %3d stack %3d shared %6d warps %d  per SM %d  grid %5d  waves %d"
          % (name, used["regs"], used["stack"], used["shared"], warps, per, grid,
             math.ceil(grid / (per * SMS))), flush=True)


GEMV_SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16",
            "N": "i32", "stride_wn": "i32", "residual_ptr": "*bf16", "norm_weight_ptr": "*bf16",
            "summed_ptr": "*bf16", "sumsq_ptr": "*fp32", "num_partials": "i32", "eps": "fp32"}
for name, prologue, n, k, residual, add, pdl in (
        ("qkv (rms_norm prologue)", g._RMS_NORM, QKV, HIDDEN, True, False, False),
        ("o (add_sumsq epilogue, PDL)", g._PLAIN, HIDDEN, HIDDEN, False, True, True),
        ("gate-up (norm_sumsq prologue, PDL)", g._NORM_SUMSQ, 2 * INTER, HIDDEN, False, False, True),
        ("down (silu_mul prologue)", g._SILU_MUL, HIDDEN, INTER, False, False, False),
        ("lm head (plain)", g._PLAIN, VOCAB, HIDDEN, False, False, False)):
    for stages in ((3, 6) if "down" in name else (3,)):
        constexprs = dict(K_STEPS=k // g.BLOCK_K, BLOCK_N=g.BLOCK_N, BLOCK_K=g.BLOCK_K,
                          STAGES=stages, HAS_BIAS=False, PROLOGUE=prologue,
                          HAS_RESIDUAL=residual, UNIT_OFFSET=False,
                          NORM_BLOCK=k if prologue == g._RMS_NORM else 256, ADD_SUMSQ=add,
                          RELEASE=True, PDL=pdl)
        kernel = compile_hopper(g._gemv_kernel, GEMV_SIG, constexprs, g.NUM_WARPS, stages)
        report(f"batch 1 gemv {name}, {stages} stages", kernel, g.NUM_WARPS,
               math.ceil(n / g.BLOCK_N))

ROWS_SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16",
            "M": "i32", "N": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_om": "i32"}
for name, n, k in (("qkv", QKV, HIDDEN), ("o", HIDDEN, HIDDEN), ("gate-up", 2 * INTER, HIDDEN),
                   ("down", HIDDEN, INTER)):
    config = g.rows_config(n, 32)
    constexprs = dict(K_STEPS=k // config["block_k"], BLOCK_M=32, BLOCK_N=config["block_n"],
                      BLOCK_K=config["block_k"], STAGES=config["stages"], HAS_BIAS=False,
                      PDL=True, PREFETCH_LINES=8)
    kernel = compile_hopper(g._rows_kernel, ROWS_SIG, constexprs, config["warps"],
                            config["stages"])
    report(f"batch 32 rows {name} ({config['block_n']}x{config['block_k']}, "
           f"{config['stages']} stages)", kernel, config["warps"],
           math.ceil(n / config["block_n"]))

for batch in (1, 32):
    plan = plan_launch(1, 4096, batch, 32, 8, 128, 2, SMS)
    constexprs = paged_attention_constexprs(plan, True, ROPE=rotates_in_launch(plan))
    kernel = compile_hopper(_paged_attention_kernel, paged_attention_signature("bf16"),
                            constexprs, plan.num_warps, plan.num_stages)
    report(f"batch {batch} attention ({plan.num_segments} segments, {plan.num_stages} stages)",
           kernel, plan.num_warps, batch * 8 * plan.num_segments)
    if not merges_in_launch(plan.num_segments, 4):
        merge = compile_hopper(_merge_segments_kernel, {
            "out_ptr": "*bf16", "segm_out_ptr": "*fp32", "segm_max_ptr": "*fp32",
            "segm_sum_ptr": "*fp32", "segm_count_ptr": "*i32", "stride_o_t": "i32",
            "stride_o_h": "i32"},
            dict(NUM_Q_HEADS=32, HEAD_DIM=128, HEAD_DIM_PAD=128,
                 NUM_SEGMENTS=plan.num_segments, SEGMENTS_PAD=plan.num_segments, PRELOAD=True,
                 PDL=True), 4)
        report(f"batch {batch} merge ({plan.num_segments} segments)", merge, 4, batch * 32)
