"""Deferred Triton variants compiled in child processes, into Triton's file cache, and loaded
from there by this process (no GPU needed: the children compile for Hopper (sm_90) as they
would beside one, and this process's driver is a stand-in with that target)."""
import importlib.util
import logging
import os

import pytest

from tests.layers.triton_devices import HOPPER, skip_without_ptxas

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="needs triton")

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("the interpreter compiles nothing", allow_module_level=True)

MODULE, NAME = "hifc.layers.triton_argmax", "_chunk_max_kernel"


@pytest.fixture
def hopper(tmp_path, monkeypatch):
    """An empty Triton file cache, and Hopper as the active driver's target, for this test
    and the children it starts; the argmax kernel's in-memory caches are emptied after it."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from hifc.layers.triton_argmax import _chunk_max_kernel
    from hifc.layers.triton_compile_process import TargetDriver

    skip_without_ptxas()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(driver, "_active", TargetDriver(GPUTarget(*HOPPER)))
    yield _chunk_max_kernel
    _chunk_max_kernel.device_caches.clear()


def meet_chunk_max(kernel, chunk: int) -> None:
    """Meet (as a launch would) the chunked-maximum kernel's variant for ``chunk`` columns."""
    import torch
    logits = torch.zeros(4, 1000, dtype=torch.bfloat16)
    best, index = torch.zeros(4, 1), torch.zeros(4, 1, dtype=torch.int32)
    kernel.warmup(logits, best, index, 1000, logits.stride(0), NUM_CHUNKS=1, CHUNK=chunk,
                  grid=(4, 1))


def test_deferred_variants_compile_in_processes_and_load_here(hopper, monkeypatch, caplog):
    from triton.backends.nvidia.compiler import CUDABackend

    from hifc.layers import triton_jit
    from hifc.layers.triton_jit import deferred_compiles, kernel_compiles

    def compiled_here(*args, **kwargs):
        raise AssertionError("a variant compiled in this process")

    # a compilation here would add its stages; a load from the file cache adds none
    monkeypatch.setattr(CUDABackend, "add_stages", compiled_here)
    before = len(kernel_compiles())
    with caplog.at_level(logging.INFO, logger="hifc.layers.triton_jit"):
        with deferred_compiles(workers=2) as noted:
            meet_chunk_max(hopper, 256)
            # the processes start at the first variant met, while the block goes on
            assert triton_jit._deferring.processes.count == 2
            meet_chunk_max(hopper, 512)
            assert len(noted) == 2 and hopper.device_caches[0][0] == {}
    assert "compiled 2 deferred kernel variants" in caplog.text
    assert "(2 of them in 2 processes, 2 threads)" in caplog.text
    assert len(hopper.device_caches[0][0]) == 2  # joined this process's kernel cache
    assert len(kernel_compiles()) == before + 2
    for chunk in (256, 512):  # compiled: met again, nothing compiles
        meet_chunk_max(hopper, chunk)
    assert len(kernel_compiles()) == before + 2


def test_a_variant_that_fails_in_its_process_fails_here_with_the_compilers_error(hopper):
    import triton

    from hifc.layers.triton_jit import deferred_compiles

    with pytest.raises(triton.CompilationError, match="power of 2"):
        with deferred_compiles(workers=1):
            meet_chunk_max(hopper, 1000)  # tl.arange over 1,000 columns: no such variant
    assert hopper.device_caches[0][0] == {}


def test_a_failing_pass_ends_the_processes_it_started_and_compiles_nothing(hopper):
    from hifc.layers import triton_jit

    started = []
    with pytest.raises(RuntimeError, match="pass failed"):
        with triton_jit.deferred_compiles(workers=2):
            meet_chunk_max(hopper, 256)
            started.append(triton_jit._deferring.processes)
            raise RuntimeError("pass failed")
    (processes,) = started
    assert all(child.poll() is not None for child in processes._children)
    assert hopper.device_caches[0][0] == {}


def test_a_job_fails_for_another_source_bad_data_or_a_dead_process(hopper):
    from hifc.layers.triton_compile_process import CompileProcesses

    processes = CompileProcesses.start(1, [MODULE])
    try:
        wrong = processes.submit((MODULE, NAME), "another source", "{}")
        with pytest.raises(RuntimeError, match="not the caller's kernel"):
            wrong.result(timeout=120)
        bad = processes.submit((MODULE, NAME), hopper.cache_key, "{}")
        with pytest.raises(RuntimeError, match="KeyError"):
            bad.result(timeout=120)
        missing = processes.submit(("hifc.layers.no_such_module", NAME), "", "{}")
        with pytest.raises(RuntimeError, match="ModuleNotFoundError"):
            missing.result(timeout=120)
        processes._children[0].kill()
        late = processes.submit((MODULE, NAME), hopper.cache_key, "{}")
        with pytest.raises(RuntimeError, match="ended"):
            late.result(timeout=120)
    finally:
        processes.close()


def test_only_kernels_at_a_modules_top_level_are_importable(hopper):
    import triton

    from hifc.layers.triton_compile_process import importable

    @triton.jit
    def local_kernel(x_ptr):
        pass

    assert importable(hopper) == (MODULE, NAME)
    assert importable(local_kernel) is None
    assert importable(meet_chunk_max) is None


@pytest.mark.gpu
def test_kernels_compiled_in_processes_launch_and_are_right(tmp_path, monkeypatch, caplog):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from hifc.layers.triton_argmax import _chunk_max_kernel, _row_argmax_kernel, argmax_rows
    from hifc.layers.triton_jit import deferred_compiles

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    for kernel in (_chunk_max_kernel, _row_argmax_kernel):
        monkeypatch.setattr(kernel, "device_caches", type(kernel.device_caches)(
            kernel.device_caches.default_factory))  # as a new process finds them
    logits = torch.randn(3, 50_000, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="hifc.layers.triton_jit"):
        with deferred_compiles(workers=2) as noted:
            argmax_rows(logits)  # met, neither compiled nor launched
            assert len(noted) == 2
    assert "(2 of them in 2 processes, 2 threads)" in caplog.text
    assert torch.equal(argmax_rows(logits), torch.argmax(logits, dim=-1))
