"""The decode attention's launch plans fit as many programs per SM as they were measured with.

``plan_launch`` splits a decode batch evenly until there are about DECODE_PROGRAMS_PER_SM
programs per SM, and those plans were measured (docs/RESULTS.md) with that many programs resident
on every SM at once. At batch 1 under a 4,096-key cap, for example, 8 KV heads x 64 segments make
512 programs, 3.9 per SM of an H100 or H200 (132 SMs). Several plans sit exactly at the register
limit (128 per thread, 4 warps, 4 programs: 65,536): one more register class per thread would
leave room for three, and 116 of those 512 programs would wait for a second wave.

These cases compile the kernel as each plan launches it, for sm_90 through the ptxas and
cuobjdump in Triton's wheel, and read its registers, spills and shared memory from the cubin."""
import importlib.util
import re
import subprocess

import pytest

from tests.layers.triton_devices import INTERPRET

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None or INTERPRET,
                                reason="needs triton, kernels compiled")

# an sm_90 SM: its register file, allocated per warp in units of 256 registers (a thread's count
# rounded up to a multiple of 8); its shared memory; its resident warps
SM_REGISTERS = 65536
SM_SHARED_BYTES = 228 * 1024
SM_WARPS = 64


def cubin_resources(kernel, tmp_path) -> dict[str, int]:
    """A compiled kernel's registers per thread, spilled bytes (stack) and the shared memory a
    program takes (its dynamic shared memory plus the cubin's static part, which on sm_90 holds
    the 1 KiB reserved per block)."""
    import triton

    path = triton.knobs.nvidia.cuobjdump.path
    if not path:
        pytest.skip("no cuobjdump in Triton's wheel")
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([path, "--dump-resource-usage", str(cubin)], capture_output=True,
                           text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", usage)
    assert found, usage
    regs, stack, static_shared = map(int, found.groups())
    return dict(regs=regs, stack=stack, shared=kernel.metadata.shared + static_shared)


def programs_per_sm(regs: int, shared: int, num_warps: int) -> int:
    """How many programs of ``num_warps`` warps with these resources an sm_90 SM holds."""
    warp_registers = -(-regs // 8) * 8 * 32
    return min(SM_REGISTERS // (warp_registers * num_warps), SM_SHARED_BYTES // shared,
               SM_WARPS // num_warps)


@pytest.mark.parametrize("cache", ["bf16", "fp8e4nv"])
@pytest.mark.parametrize("batch", [1, 4, 32])
def test_even_decode_plans_fit_their_programs_per_sm(batch, cache, tmp_path):
    from hifc.layers.triton_attention import (DECODE_PROGRAMS_PER_SM, _paged_attention_kernel,
                                              plan_launch, rotates_in_launch)
    from tests.layers.test_triton_compile_fp8 import (compile_hopper, paged_attention_constexprs,
                                                      paged_attention_signature)

    sms = 132
    plan = plan_launch(1, 4096, batch, 32, 8, 128, 2, sms)
    programs = batch * 8 * plan.num_segments
    # an even split (one tile per segment) into about DECODE_PROGRAMS_PER_SM programs per SM, or
    # fewer where the launch merges its partials itself (batch 1: 32 segments, 2 per SM)
    per_sm = DECODE_PROGRAMS_PER_SM if batch > 1 else 2
    assert plan.segment_tiles == 1 and programs > (per_sm - 1) * sms
    fp8 = cache == "fp8e4nv"
    constexprs = paged_attention_constexprs(plan, True, ROPE=rotates_in_launch(plan),
                                            KV_FP8=fp8, FP8_ASM=fp8)
    kernel = compile_hopper(_paged_attention_kernel, paged_attention_signature(cache),
                            constexprs, plan.num_warps, plan.num_stages)
    used = cubin_resources(kernel, tmp_path)
    assert used["stack"] == 0, used  # nothing spilled to local memory
    fits = programs_per_sm(used["regs"], used["shared"], plan.num_warps)
    assert fits >= per_sm, (plan, used)


def test_programs_per_sm_counts_registers_in_warp_units():
    assert programs_per_sm(128, 40 * 1024, 4) == 4
    assert programs_per_sm(129, 40 * 1024, 4) == 3  # 136 per thread as allocated
    assert programs_per_sm(64, 100 * 1024, 4) == 2  # shared memory bound
    assert programs_per_sm(16, 1024, 8) == 8  # warps bound
