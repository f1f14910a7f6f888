"""Programmatic dependent launch: when the kernels use it, what they compile to (the wait before
anything the step computes is read, weights and K/V prefetched into L2 before it), and on a GPU
the same greedy outputs with it as without."""
import dataclasses
from types import MappingProxyType

import pytest
import torch

from hifc.layers import triton_pdl
from tests.layers.triton_devices import HAS_TRITON, INTERPRET

WAIT, RELEASE, PREFETCH = ("griddepcontrol.wait", "griddepcontrol.launch_dependents",
                           "prefetch.global.L2")


def assert_prefetch_then_wait(ptx: str, pdl: bool, releasing_first: bool = False) -> None:
    """With PDL the kernel prefetches into L2, then waits, then releases its dependents (or
    releases them before it waits); without it, none of the three."""
    if not pdl:
        assert WAIT not in ptx and RELEASE not in ptx and PREFETCH not in ptx
        return
    assert ptx.index(PREFETCH) < ptx.index(WAIT)
    assert (ptx.index(RELEASE) < ptx.index(WAIT)) == releasing_first
    assert ptx.count(WAIT) == 1


@pytest.fixture
def fresh_choice(monkeypatch):
    """enabled() decides again in this test (it caches per device)."""
    monkeypatch.setattr(triton_pdl, "_enabled", {})
    return monkeypatch


def test_off_the_gpu_and_where_switched_off(fresh_choice):
    assert not triton_pdl.enabled(torch.device("cpu"))
    assert triton_pdl.options(False) == {"PDL": False}
    assert triton_pdl.options(True) == {"PDL": True, "launch_pdl": True}
    if not HAS_TRITON:
        assert not triton_pdl.enabled(torch.device("cuda", 0))
        return
    fresh_choice.delenv("TRITON_INTERPRET", raising=False)
    capability = {0: (9, 0), 1: (8, 0), 2: (9, 0)}
    fresh_choice.setattr(torch.cuda, "get_device_capability", lambda i: capability[i])
    fresh_choice.setenv("HIFC_PDL", "1")
    assert triton_pdl.enabled(torch.device("cuda", 0))  # Hopper
    assert not triton_pdl.enabled(torch.device("cuda", 1))  # Ampere has no PDL
    fresh_choice.setenv("HIFC_PDL", "0")
    assert not triton_pdl.enabled(torch.device("cuda", 2))
    fresh_choice.setenv("TRITON_INTERPRET", "1")
    assert not triton_pdl.enabled(torch.device("cuda", 0))


def test_prefetch_lines_cover_the_first_elements_of_a_row():
    assert triton_pdl.prefetch_lines(4096, 2, 1024) == 16  # two 512-wide bf16 slices
    assert triton_pdl.prefetch_lines(256, 2, 1024) == 4  # at most the row
    assert triton_pdl.prefetch_lines(4096, 2, 100) == 2  # 200 bytes: two lines
    assert triton_pdl.prefetch_lines(4096, 2, 192) == 2  # three lines, down to a power of two
    assert triton_pdl.prefetch_lines(96, 2, 1024) == 2  # a 192-byte row: both lines start in it
    assert triton_pdl.prefetch_lines(320, 2, 1024) == 4  # five lines, never one past the row
    assert triton_pdl.prefetch_lines(4096, 1, 64) == 1


@pytest.mark.skipif(not HAS_TRITON or INTERPRET, reason="needs triton, kernels compiled")
@pytest.mark.parametrize("pdl", [False, True])
def test_elementwise_and_merge_kernels_wait_before_reading(pdl):
    from hifc.layers.triton_attention import _merge_segments_kernel
    from hifc.layers.triton_fused import _rms_norm_kernel, _silu_and_mul_kernel
    from tests.layers.test_triton_compile_fp8 import compile_ptx

    norm = compile_ptx(_rms_norm_kernel, {
        "x_ptr": "*bf16", "residual_ptr": "*bf16", "weight_ptr": "*bf16", "out_ptr": "*bf16",
        "summed_ptr": "*bf16", "stride_x": "i32", "stride_residual": "i32",
        "stride_out": "i32", "stride_summed": "i32", "eps": "fp32"},
        dict(HIDDEN=4096, BLOCK=4096, HAS_RESIDUAL=True, UNIT_OFFSET=False, PDL=pdl), 16)
    silu = compile_ptx(_silu_and_mul_kernel, {
        "gate_up_ptr": "*bf16", "out_ptr": "*bf16", "stride_in": "i32", "stride_out": "i32"},
        dict(INTERMEDIATE=14336, BLOCK=1024, PRECISE_EXP=True, PDL=pdl), 4)
    merge = compile_ptx(_merge_segments_kernel, {
        "out_ptr": "*bf16", "segm_out_ptr": "*fp32", "segm_max_ptr": "*fp32",
        "segm_sum_ptr": "*fp32", "segm_count_ptr": "*i32", "stride_o_t": "i32",
        "stride_o_h": "i32"},
        dict(NUM_Q_HEADS=32, HEAD_DIM=128, HEAD_DIM_PAD=128, NUM_SEGMENTS=64, SEGMENTS_PAD=64,
             PRELOAD=True, PDL=pdl), 4)
    for ptx, releasing_first in ((norm, True), (silu, True), (merge, False)):
        assert (WAIT in ptx) == pdl and (RELEASE in ptx) == pdl and PREFETCH not in ptx
        if pdl:  # the wait comes before the first global load
            assert ptx.index(WAIT) < ptx.index("ld.global")
            assert (ptx.index(RELEASE) < ptx.index(WAIT)) == releasing_first


@pytest.mark.skipif(not HAS_TRITON or INTERPRET, reason="needs triton, kernels compiled")
def test_rotary_kv_write_releases_the_attention_first_and_the_attention_prefetches():
    from hifc.layers.triton_attention import _paged_attention_kernel, plan_launch
    from hifc.layers.triton_kv_write import _rotary_kv_write_kernel
    from tests.layers.test_triton_compile_fp8 import (compile_ptx, paged_attention_constexprs,
                                                      paged_attention_signature,
                                                      rotary_kv_write_signature)

    rope = compile_ptx(_rotary_kv_write_kernel, rotary_kv_write_signature("bf16"),
                       dict(NUM_Q_HEADS=32, NUM_KV_HEADS=8, HALF=64, BLOCK_HQ=32, BLOCK_HKV=8,
                            BLOCK_HALF=64, BLOCK_D=128, KV_FP8=False, FP8_MAX=448.0, PDL=True),
                       num_warps=4)
    assert rope.index(RELEASE) < rope.index(WAIT) < rope.index("ld.global")

    plan = plan_launch(1, 4096, 1, 32, 8, 128, 2, 132)
    assert plan.num_segments > 1
    for decode_only in (True, False):
        constexprs = paged_attention_constexprs(plan, decode_only, PDL=True)
        ptx = compile_ptx(_paged_attention_kernel, paged_attention_signature("bf16"),
                          constexprs, plan.num_warps, plan.num_stages)
        if decode_only:  # the first K/V tile of its segment, before the wait
            assert_prefetch_then_wait(ptx, True)
            assert ptx.count(PREFETCH) >= 2  # K and V
        else:
            assert PREFETCH not in ptx and ptx.index(WAIT) < ptx.index(RELEASE)


# A Llama whose projections take the Triton GEMV and small-M kernel (K a multiple of 512).
GEMV_LLAMA = dict(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=128)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()) or INTERPRET,
                    reason="needs triton and a CUDA GPU")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_greedy_outputs_are_the_same_with_and_without_pdl(fresh_choice, kv_cache_dtype):
    from hifc import LLM, loader
    from hifc.models import presets
    from tests.runtime.helpers import output_tokens, random_prompts, staggered

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability 9.0")
    extended = MappingProxyType({**presets.PRESETS, "gemv-llama": dataclasses.replace(
        presets.PRESETS["tiny-llama"], **GEMV_LLAMA)})
    fresh_choice.setattr(presets, "PRESETS", extended)
    fresh_choice.setattr(loader, "PRESETS", extended)
    prompts = random_prompts(9, (1, 700), seed=3)
    params = staggered(9, max_tokens=6, step=5)  # the batch shrinks to 1 with a long context
    common = dict(device="cuda", dtype="bfloat16", block_size=16, num_gpu_blocks=1024,
                  max_num_seqs=9, kv_cache_dtype=kv_cache_dtype)
    outputs = {}
    for setting in ("0", "1"):
        fresh_choice.setenv("HIFC_PDL", setting)
        triton_pdl._enabled.clear()
        llm = LLM("random:gemv-llama", **common)
        assert triton_pdl.enabled(torch.device("cuda")) == (setting == "1")
        outputs[setting] = output_tokens(llm, prompts, params)
        assert llm.stats()["graph_decode_steps"] > 0
        del llm
    assert outputs["1"] == outputs["0"]
