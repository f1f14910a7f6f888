"""Instruction counts in the sm_90 PTX of the paged attention kernel over a float8 cache, for
the decode plans of the 8B preset's heads (bf16 q, RoPE and the KV write in the launch where
the plan takes them) and a prompt chunk. Compiles without a GPU (Triton's compiler and ptxas).

    PYTHONPATH=<hifc to measure>:<repo root> python ptx_counts.py LABEL
"""
import re
import sys

from hifc.layers.triton_attention import _paged_attention_kernel, plan_launch, rotates_in_launch
from tests.layers.test_triton_compile_fp8 import (compile_ptx, paged_attention_constexprs,
                                                  paged_attention_signature)

PATTERNS = {
    "cvt e4m3x2->f16x2": r"cvt\.rn\.f16x2\.e4m3x2",
    "cvt f16->bf16": r"cvt\.bf16\.f16",
    "ld.shared.b8": r"ld\.shared\.b8\b",
    "ldmatrix.trans": r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans",
    "mma bf16": r"mma\.[\w.]*\.bf16\.bf16",
    "mma f16": r"mma\.[\w.]*\.f16\.f16",
}
label = sys.argv[1]
shapes = [("decode 1 x 4096", 1, 4096, 1), ("decode 32 x 4096", 1, 4096, 32),
          ("decode 128 x 4096", 1, 4096, 128), ("chunk 16 after 4096", 16, 4112, 1)]
print(f"{label}: " + " | ".join(["shape", "plan (tile, segments, warps, stages)", "PTX lines",
                                  *PATTERNS]))
for name, query_len, seq_len, num_seqs in shapes:
    plan = plan_launch(query_len, seq_len, num_seqs, 32, 8, 128, 1, 132)
    decode = query_len == 1
    flags = dict(KV_FP8=True, ROPE=decode and rotates_in_launch(plan))
    constexprs = paged_attention_constexprs(plan, decode, FP8_ASM=True, **flags)
    if "FP8_ASM" not in _paged_attention_kernel.arg_names:  # the code before
        del constexprs["FP8_ASM"]
    ptx = compile_ptx(_paged_attention_kernel, paged_attention_signature("fp8e4nv"), constexprs,
                      plan.num_warps, plan.num_stages)
    counts = [len(re.findall(p, ptx)) for p in PATTERNS.values()]
    print(f"{label}: " + " | ".join([name, f"{plan.tile}, {plan.num_segments}, "
                                     f"{plan.num_warps}, {plan.num_stages}",
                                     str(len(ptx.splitlines())), *map(str, counts)]), flush=True)
