"""Triton compilations are recorded through Triton's JIT hooks (no GPU needed: the hooks are
called as Triton calls them around a compilation), and compilations deferred to a pool of
threads."""
import hashlib
import os
import threading
import time
import types

import pytest

from hifc.layers.triton_jit import deferred_compiles, kernel_compiles, meet_kernels

triton = pytest.importorskip("triton")
from triton.runtime import _async_compile  # noqa: E402


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


@pytest.fixture(autouse=True)
def triton_cache(tmp_path, monkeypatch):
    """Triton's file cache, empty for each test."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    return tmp_path / "triton"


def cache_key(data):
    return f"fake:{data}"


def put_in_disk_cache(data):
    """Store a compilation of the variant with this specialisation data in Triton's cache."""
    from triton.runtime.cache import get_cache_manager
    manager = get_cache_manager(hashlib.sha256(cache_key(data).encode()).hexdigest())
    manager.put_group("kern.json", {})


class FakeFunction:
    """A JIT function as the deferral sees it. Its preload is Triton's: the compile hook, then
    the compilation (handed with its cache key to the active AsyncCompileMode, where one is),
    which this fake records as the specialisation data it compiled."""

    def __init__(self):
        self.preloaded = []

    def preload(self, data):
        if meet(self, data, data):
            return None
        mode = _async_compile.active_mode.get()
        if mode is None:
            self.preloaded.append(data)
            return None
        return mode.submit(cache_key(data), lambda: self.preloaded.append(data),
                           lambda kernel: None)


def meet(function, key, data):
    """Call the compile hook as Triton's launch of an uncompiled variant does."""
    info = types.SimpleNamespace(jit_function=function)
    return triton.knobs.runtime.jit_cache_hook(
        key=key, repr=f"k{key}", fn=info, compile={"specialization_data": data},
        is_manual_warmup=False, already_compiled=False)


def test_deferred_variants_are_skipped_then_compiled_once_each_on_leaving():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    f, g = FakeFunction(), FakeFunction()
    before = len(kernel_compiles())
    with deferred_compiles(workers=2):
        assert meet(f, "a", "A") is True  # Triton then neither compiles nor launches it
        assert meet(f, "a", "A") is True  # met again before it compiled
        assert meet(g, "b", "B") is True
        other = []  # another thread's launches compile as they come
        thread = threading.Thread(target=lambda: other.append(meet(f, "c", "C")))
        thread.start()
        thread.join()
        assert other == [None]
        assert f.preloaded == g.preloaded == []
    assert f.preloaded == ["A"] and g.preloaded == ["B"]
    assert meet(f, "d", "D") is None  # after the block, variants compile as they launch
    assert len(kernel_compiles()) == before


def test_deferral_blocks_do_not_nest_and_a_second_thread_compiles_as_it_launches():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    f = FakeFunction()
    with deferred_compiles():
        with pytest.raises(RuntimeError, match="do not nest"):
            with deferred_compiles():
                pass
        met = []

        def other_thread():
            with deferred_compiles() as noted:  # another thread defers already: not this one
                met.append((meet(f, "b", "B"), dict(noted)))

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert met == [(None, {})]
        assert meet(f, "a", "A") is True
    assert f.preloaded == ["A"]


def test_a_failing_block_compiles_nothing_and_ends_the_deferral():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    f = FakeFunction()
    with pytest.raises(RuntimeError, match="step failed"):
        with deferred_compiles():
            assert meet(f, "a", "A") is True
            raise RuntimeError("step failed")
    assert f.preloaded == []
    assert meet(f, "a", "A") is None


def test_a_deferred_variant_in_the_disk_cache_loads_and_launches_where_it_is_met():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    f = FakeFunction()
    put_in_disk_cache("H")
    with deferred_compiles() as noted:
        assert meet(f, "h", "H") is None  # Triton loads it from its cache and launches it
        assert meet(f, "m", "M") is True  # not in the cache: skipped and noted
        assert list(noted) == ["m"]
        assert f.preloaded == []  # looking in the cache compiled nothing
    assert f.preloaded == ["M"]


def test_the_disk_cache_is_not_trusted_where_triton_compiles_every_variant(monkeypatch):
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    f = FakeFunction()
    put_in_disk_cache("H")
    with deferred_compiles() as noted:
        assert meet(f, "h", "H") is True
        assert list(noted) == ["h"]
    assert f.preloaded == ["H"]


class GatedFunction(FakeFunction):
    """A fake JIT function whose pool compilation waits for ``gate`` and, as Triton's, joins
    its kernel's cache through the post-compile hook."""

    def __init__(self):
        super().__init__()
        self.gate, self.done = threading.Event(), threading.Event()

    def preload(self, data):
        if meet(self, data, data):
            return None
        mode = _async_compile.active_mode.get()
        if mode is None:  # compiled as it launches
            self.preloaded.append(data)
            return None

        def compile_in_pool():
            assert self.gate.wait(10), "the pool's compilation waited for meanwhile in vain"
            self.preloaded.append(data)
            self.done.set()

        def finalize(kernel):
            triton.knobs.runtime.jit_post_compile_hook(
                key=data.lower(), repr=f"k{data}", compile={"specialization_data": data})

        return mode.submit(cache_key(data), compile_in_pool, finalize)


def test_met_variants_compile_in_the_pool_while_meanwhile_runs_on_this_thread():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    f = GatedFunction()
    before = len(kernel_compiles())
    during = {}

    def meanwhile():  # the pool compiles A only once this runs (a serial order would hang)
        f.gate.set()
        assert f.done.wait(10)
        f.preload("D")  # this thread's own launches compile as they come
        during["preloaded"] = list(f.preloaded)
        time.sleep(0.5)  # longer than the compilation itself: not part of its duration

    started = time.perf_counter()
    assert meet_kernels([lambda: meet(f, "a", "A")], meanwhile=meanwhile) == [0]
    took = time.perf_counter() - started
    assert during["preloaded"] == ["A", "D"]
    (compiled,) = kernel_compiles()[before:]
    assert compiled.kernel == "kA" and compiled.seconds < took - 0.25


def test_meanwhile_runs_where_nothing_was_met_or_nothing_can_defer(monkeypatch):
    calls = []
    assert meet_kernels([lambda: None], meanwhile=lambda: calls.append(1)) == []
    monkeypatch.setattr(triton, "__version__", "3.7.0")  # deferral not tested with it
    f = FakeFunction()
    assert meet_kernels([lambda: meet(f, "a", "A")], meanwhile=lambda: calls.append(2)) == []
    assert calls == [1, 2]
    with pytest.raises(RuntimeError, match="step failed"):  # a failing pass: nothing more
        meet_kernels([lambda: (_ for _ in ()).throw(RuntimeError("step failed"))],
                     meanwhile=lambda: calls.append(3))
    assert calls == [1, 2]


@pytest.mark.gpu
def test_a_deferred_kernel_is_not_launched_then_compiled_and_right():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(1000, device="cuda")
    before = len(kernel_compiles())
    with deferred_compiles():
        for block in (128, 256):
            add_one[(triton.cdiv(1000, block),)](x, 1000, BLOCK=block)
        assert torch.count_nonzero(x).item() == 0  # neither launch ran
        assert len(kernel_compiles()) == before
    assert len(kernel_compiles()) == before + 2  # both variants, side by side
    for block in (128, 256):
        add_one[(triton.cdiv(1000, block),)](x, 1000, BLOCK=block)
    assert torch.equal(x, torch.full_like(x, 2))
    assert len(kernel_compiles()) == before + 2  # launched from what the block compiled
    add_one.device_caches.clear()  # as a new process finds them: in the disk cache only
    with deferred_compiles() as noted:
        add_one[(triton.cdiv(1000, 128),)](x, 1000, BLOCK=128)
        assert torch.equal(x, torch.full_like(x, 3))  # loaded and launched where it was met
    assert noted == {} and len(kernel_compiles()) == before + 3


def test_a_triton_version_deferral_was_not_tested_with_compiles_as_it_launches(monkeypatch):
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    f = FakeFunction()
    with deferred_compiles() as noted:
        assert meet(f, "a", "A") is None  # Triton compiles it and launches it
    assert noted == {} and f.preloaded == []


def test_parts_that_met_new_variants_are_the_ones_to_run_again():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter compiles nothing")
    f = FakeFunction()
    launches = {0: ["a", "b"], 1: ["a"], 2: [], 3: ["b", "c"]}
    # a launch of a compiled variant does not reach the hook
    parts = [lambda keys=keys: [meet(f, key, key.upper()) for key in keys
                                if key.upper() not in f.preloaded]
             for keys in launches.values()]
    assert meet_kernels(parts) == [0, 3]  # part 1 met only a, which part 0 met first
    assert sorted(f.preloaded) == ["A", "B", "C"]
    assert meet_kernels(parts) == []  # compiled now: every part runs for real
    assert meet_kernels(parts, every=True) == [0, 1, 2, 3]  # tensor-parallel ranks
