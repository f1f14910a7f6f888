"""The float8 KV kernels compile for Hopper (sm_90) on a machine without a GPU.

The interpreter runs the kernels' numpy semantics (it broadcasts where the compiler does not,
and converts float8 in software), so these compile them the way a GPU run would, through PTX and
ptxas, and check that float8 is converted by the hardware instructions."""
import importlib.util
import re

import pytest

from tests.layers.triton_devices import HOPPER, skip_without_ptxas

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs triton")


def compile_hopper(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 2):
    """``fn`` compiled for sm_90 (Triton's compiled kernel, not loaded), pointers and strides
    taken as 16-byte aligned (as Triton specialises them at launch)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature) + list(constexprs)
    aligned = [n for n in signature if signature[n].startswith("*") or n.startswith("stride")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(fn, {**signature, **{n: "constexpr" for n in constexprs}}, constexprs,
                       attrs)
    skip_without_ptxas()
    return triton.compile(source, target=GPUTarget(*HOPPER),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def compile_ptx(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 2):
    """PTX of ``fn`` for sm_90, as ``compile_hopper`` compiles it."""
    return compile_hopper(fn, signature, constexprs, num_warps, num_stages).asm["ptx"]


def rotary_kv_write_signature(cache: str) -> dict:
    """The RoPE + KV-write kernel's runtime arguments with a cache of Triton type ``cache``."""
    pointers = {name: "*bf16" for name in ("cos_ptr", "sin_ptr", "q_ptr", "k_ptr", "v_ptr",
                                           "q_out_ptr", "k_out_ptr")}
    pointers.update(positions_ptr="*i64", k_cache_ptr=f"*{cache}", v_cache_ptr=f"*{cache}",
                    slot_mapping_ptr="*i64", k_scale_ptr="*fp32", v_scale_ptr="*fp32")
    order = ["positions_ptr", "cos_ptr", "sin_ptr", "q_ptr", "k_ptr", "v_ptr", "q_out_ptr",
             "k_out_ptr", "k_cache_ptr", "v_cache_ptr", "slot_mapping_ptr", "k_scale_ptr",
             "v_scale_ptr"]
    strides = {name: "i32" for name in (
        "stride_cos", "stride_q_t", "stride_q_h", "stride_k_t", "stride_k_h", "stride_v_t",
        "stride_v_h", "stride_qo_t", "stride_qo_h", "stride_ko_t", "stride_ko_h",
        "stride_kc_slot", "stride_kc_head", "stride_vc_slot", "stride_vc_head")}
    return {**{name: pointers[name] for name in order}, **strides}


def paged_attention_signature(cache: str) -> dict:
    """The paged attention kernel's runtime arguments with a cache of Triton type ``cache``."""
    signature = {"out_ptr": "*bf16", "segm_out_ptr": "*fp32", "segm_max_ptr": "*fp32",
                 "segm_sum_ptr": "*fp32", "segm_count_ptr": "*i32", "q_ptr": "*bf16",
                 "k_cache_ptr": f"*{cache}", "v_cache_ptr": f"*{cache}",
                 "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32",
                 "query_start_loc_ptr": "*i32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
                 "positions_ptr": "*i64", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
                 "k_new_ptr": "*bf16", "v_new_ptr": "*bf16", "slot_mapping_ptr": "*i64",
                 "arrivals_ptr": "*i32",
                 "qk_scale": "fp32", "softcap_log2": "fp32", "window": "i32", "num_seqs": "i32"}
    signature.update({name: "i32" for name in (
        "stride_q_t", "stride_q_h", "stride_o_t", "stride_o_h", "stride_k_blk", "stride_k_off",
        "stride_k_head", "stride_v_blk", "stride_v_off", "stride_v_head", "stride_bt",
        "stride_cos", "stride_kn_t", "stride_kn_h", "stride_vn_t", "stride_vn_h")})
    return signature


def paged_attention_constexprs(plan, decode_only: bool, **flags) -> dict:
    """The paged attention kernel's compile-time arguments for the 8B preset's heads (32 query
    heads, 8 KV heads of 128) under ``plan``, without RoPE, window, soft-capping or float8 and
    merging in the launch when a decode-only plan splits (into few enough segments);
    ``flags`` override any."""
    from hifc.layers.triton_attention import merges_in_launch

    return dict(NUM_Q_HEADS=32, GROUP=4, HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_SIZE=64,
                TILE=plan.tile, BLOCK_M=plan.block_m, BLOCK_Q=plan.block_q,
                NUM_SEGMENTS=plan.num_segments, SEGMENT_TILES=plan.segment_tiles,
                DECODE_ONLY=decode_only, SLIDING=False, SOFTCAP=False, KV_FP8=False,
                DOT_PRECISION="tf32", PDL=decode_only, ROPE=False,
                MERGE=decode_only and merges_in_launch(plan.num_segments, 4), GROUP_PAD=4,
                SEGMENTS_PAD=max(2, plan.num_segments), FP8_MAX=448.0, FP8_ASM=False) | flags


def test_fp8_kv_write_compiles_to_saturating_conversions():
    from hifc.dtypes import FP8_E4M3_MAX
    from hifc.layers.triton_kv_write import _kv_write_kernel

    pointers = {"k_ptr": "*bf16", "v_ptr": "*bf16", "k_cache_ptr": "*fp8e4nv",
                "v_cache_ptr": "*fp8e4nv", "slot_mapping_ptr": "*i64", "k_scale_ptr": "*fp32",
                "v_scale_ptr": "*fp32"}
    strides = {name: "i32" for name in ("stride_k_t", "stride_k_h", "stride_v_t", "stride_v_h",
                                        "stride_kc_slot", "stride_kc_head", "stride_vc_slot",
                                        "stride_vc_head")}
    ptx = compile_ptx(_kv_write_kernel, {**pointers, **strides},
                      dict(NUM_KV_HEADS=8, HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128, KV_FP8=True,
                           FP8_MAX=FP8_E4M3_MAX, PDL=False), num_warps=4)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx  # round to nearest even, as torch does
    assert "div.rn.f32" in ptx  # IEEE division, as torch divides


def test_fp8_rotary_kv_write_compiles_to_saturating_conversions():
    from hifc.dtypes import FP8_E4M3_MAX
    from hifc.layers.triton_kv_write import _rotary_kv_write_kernel

    ptx = compile_ptx(_rotary_kv_write_kernel, rotary_kv_write_signature("fp8e4nv"),
                      dict(NUM_Q_HEADS=32, NUM_KV_HEADS=8, HALF=64, BLOCK_HQ=32, BLOCK_HKV=8,
                           BLOCK_HALF=64, BLOCK_D=128, KV_FP8=True, FP8_MAX=FP8_E4M3_MAX,
                           PDL=True), num_warps=4)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "div.rn.f32" in ptx  # as the KV write


@pytest.mark.parametrize("max_query_len,num_seqs,split_kv", [(1, 2, True), (512, 1, False)],
                         ids=["decode-split", "prefill"])
def test_fp8_paged_attention_compiles_to_hardware_conversions(max_query_len, num_seqs,
                                                               split_kv):
    from hifc.layers.triton_attention import _paged_attention_kernel, plan_launch

    plan = plan_launch(max_query_len, 4096, num_seqs, 32, 8, 128, 2, 132, split_kv)
    assert (plan.num_segments > 1) == split_kv
    decode = max_query_len == 1  # with the K/V prefetch, RoPE, the KV write and the merge
    constexprs = paged_attention_constexprs(plan, decode, SLIDING=True, SOFTCAP=True,
                                            KV_FP8=True, ROPE=decode, FP8_ASM=True)
    ptx = compile_ptx(_paged_attention_kernel, paged_attention_signature("fp8e4nv"), constexprs,
                      plan.num_warps,
                      plan.num_stages)
    assert "cvt.rn.f16x2.e4m3x2" in ptx  # float8 pairs converted by the hardware
    # to float16 and attended in float16: no float16 -> bfloat16 conversion per element
    assert re.search(r"(mma\.sync\.aligned\.m16n8k16\.row\.col|wgmma\.mma_async\.sync\.aligned"
                     r"\.m\d+n\d+k16)\.f32\.f16\.f16", ptx)
    assert "cvt.bf16.f16" not in ptx
    # K and V read 16 bytes (16 float8 values) at a time, from global into shared memory, and
    # never a byte at a time out of it (a decode's V tile is converted before its transposed
    # read)
    assert "ld.global.v4.b32" in ptx or "cp.async.cg.shared.global" in ptx
    assert "ld.shared.b8" not in ptx
    if decode:  # the new K/V written as the KV write writes them
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "div.rn.f32" in ptx


def test_decode_attention_merges_after_a_barrier_and_a_releasing_arrival():
    # Every thread's partials are stored before the program's arrival (a barrier, then one
    # acquire-release atomic at GPU scope); the merging program reads the others' partials
    # past L1.
    from hifc.layers.triton_attention import _paged_attention_kernel, plan_launch

    plan = plan_launch(1, 4096, 4, 32, 8, 128, 2, 132)
    assert plan.num_segments > 1
    ptx = compile_ptx(_paged_attention_kernel, paged_attention_signature("bf16"),
                      paged_attention_constexprs(plan, True, ROPE=True, MERGE=True), plan.num_warps,
                      plan.num_stages)
    arrival = ptx.index("atom.global.gpu.acq_rel.add")
    assert ptx.rfind("bar.sync", 0, arrival) > ptx.rfind("st.global", 0, arrival)
    assert "ld.global.cg" in ptx[arrival:]
