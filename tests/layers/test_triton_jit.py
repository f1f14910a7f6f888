"""Triton compilations are recorded through Triton's JIT hooks (no GPU needed: the hooks are
called as Triton calls them around a compilation)."""
import pytest

from hifc.layers.triton_jit import kernel_compiles

triton = pytest.importorskip("triton")


def test_a_compilation_is_recorded_with_its_duration():
    runtime = triton.knobs.runtime
    before = len(kernel_compiles())
    key, desc = ("kern", (1, "i32")), "kern[num_warps=4](n: i32, BLOCK: constexpr=64)"
    hook_args = dict(fn=None, compile={"specialization_data": '{"constants": [64]}'},
                     is_manual_warmup=False, already_compiled=False)
    # a true value from the first hook would make Triton skip the compilation
    assert runtime.jit_cache_hook(key=key, repr=desc, **hook_args) is None
    assert len(kernel_compiles()) == before  # not compiled yet
    assert runtime.jit_post_compile_hook(key=key, repr=desc, **hook_args) is None
    new = kernel_compiles()[before:]
    assert [c.kernel for c in new] == [desc] and 0 <= new[0].seconds < 60
    assert new[0].specialization == '{"constants": [64]}'
