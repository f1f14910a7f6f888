"""Triton where it is installed: ``triton`` and ``tl`` (None without it) and ``jit``, which
compiles a kernel with Triton or, without Triton, leaves the function as it is, so that the
kernel modules import on CPU-only installs (their callers then use the torch code or refuse).

Every compilation in the process (a kernel specialisation's first use: Triton compiles one per
set of compile-time constants and argument properties) is recorded through Triton's JIT hooks,
with its duration: ``kernel_compiles()``. A compile inside a timed region is a first use, not
steady-state speed; the benchmarks report them (one took 2.1-2.4 s on the H200).

``deferred_compiles()`` lets start-up compile many variants at once: a pass run inside it only
meets the kernels (a launch whose variant is neither compiled nor in Triton's disk cache is
skipped and noted), and on leaving it every noted variant compiles side by side, so that the
pass run again for real finds them compiled. A variant in the disk cache loads and launches
where it is met. Start-up work of the GPU's own (timing the GEMMs) can run on the calling
thread while they compile.

Variants of kernels defined at a module's top level compile in processes of their own
(``hifc.layers.triton_compile_process``) into Triton's file cache, from which a pool of threads
then loads them into the kernels' caches: a compilation's Python part (the kernel's code
generation) holds its process's GIL, which in threads kept the calling thread's own start-up
work waiting. Other variants, or all of them where processes cannot start, compile in the
threads themselves."""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from hifc.layers.triton_compile_process import CompileProcesses, importable

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None

log = logging.getLogger(__name__)


def interpreting() -> bool:
    """True when Triton runs kernels through its interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def jit(fn=None, **options):
    """``triton.jit(fn, **options)``; usable bare (``@jit``) or with options
    (``@jit(do_not_specialize=[...])``)."""
    if fn is None:
        return lambda f: jit(f, **options)
    return triton.jit(fn, **options) if triton is not None else fn


@dataclass(frozen=True)
class KernelCompile:
    kernel: str  # Triton's description: name[launch options](...)
    # from the request to the end (deferred variants compile side by side: theirs overlap)
    seconds: float
    # Triton's specialisation data (JSON: signature, constants, argument attributes such as
    # 16-byte divisibility), what sets this compilation apart from the kernel's others
    specialization: str = ""


_compiles: list[KernelCompile] = []
_started: dict[str, float] = {}
# when the compilation being finalised (a deferred one, done in the pool) ended
_compiled_at: float | None = None
_hooks_installed = False


@dataclass
class _Deferral:
    """The thread inside ``deferred_compiles``, the variants it met (key -> (JITFunction,
    Triton's specialisation data)), and the processes that will compile them, started when it
    meets its first variant one can compile, so that they start up while its pass goes on."""
    thread: int
    workers: int
    noted: dict[str, tuple[object, str]]
    processes: CompileProcesses | None = None
    started_processes: bool = False

    def note(self, key: str, function, data: str) -> None:
        self.noted[key] = (function, data)
        if self.started_processes or not _file_cache_serves():
            return
        source = importable(function)
        if source is not None:
            self.started_processes = True
            self.processes = CompileProcesses.start(min(self.workers, MAX_COMPILE_PROCESSES),
                                                    [source[0]])


_deferring: _Deferral | None = None


def kernel_compiles() -> list[KernelCompile]:
    """The Triton compilations of this process so far, oldest first."""
    return list(_compiles)


class _DiskCacheProbe:
    """Stands in for Triton's ``AsyncCompileMode`` while a variant's ``preload`` runs: Triton
    hands it the variant's cache key and the compilation, and it compiles nothing, only looks
    whether Triton's file cache holds the variant (a compilation would then only load it)."""

    def __init__(self):
        self.cached = False

    def submit(self, key: str, compile_fn, finalize_fn) -> None:
        if not _file_cache_serves():
            return None
        from triton.runtime.cache import get_cache_manager
        manager = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
        # a compilation's last write is its group file, naming the files it stored
        self.cached = any(name.startswith("__grp__") for name in os.listdir(manager.cache_dir))
        return None


def _file_cache_serves() -> bool:
    """Whether a compilation finds its variant in Triton's file cache when one is there (not
    with another cache manager, nor where Triton compiles every variant)."""
    knobs = triton.knobs
    return knobs.cache.manager_class is None and not knobs.compilation.always_compile


def _in_disk_cache(function, specialization_data: str) -> bool:
    """Whether Triton's file cache holds this variant of ``function`` (a JITFunction)."""
    from triton.runtime import _async_compile
    probe = _DiskCacheProbe()
    token = _async_compile.active_mode.set(probe)
    try:
        function.preload(specialization_data)  # builds the cache key, hands it to the probe
    finally:
        _async_compile.active_mode.reset(token)
    return probe.cached


def _probing() -> bool:
    from triton.runtime import _async_compile
    return isinstance(_async_compile.active_mode.get(), _DiskCacheProbe)


def _before_compile(*, key, repr: str, fn=None, compile=None,  # noqa: A002 (Triton's keyword)
                    **_) -> bool | None:
    deferring = _deferring
    if deferring is not None and deferring.thread == threading.get_ident() and not _probing():
        name = str(key)
        if name in deferring.noted:
            return True
        data = compile["specialization_data"]
        if not _in_disk_cache(fn.jit_function, data):
            deferring.note(name, fn.jit_function, data)
            return True  # Triton skips the compilation, and the launch with it
        # in the disk cache: Triton loads it and launches it
    _started[str(key)] = time.perf_counter()
    return None


def _after_compile(*, key, repr: str, compile=None, **_) -> None:  # noqa: A002
    started = _started.pop(str(key), None)
    ended = _compiled_at if _compiled_at is not None else time.perf_counter()
    seconds = ended - started if started is not None else 0.0
    details = (compile or {}).get("specialization_data") or ""
    _compiles.append(KernelCompile(repr, seconds, str(details)))
    log.debug("compiled %s in %.2f s", repr, seconds)
    return None


def _install_hooks() -> None:
    """Record compilations, unless the application set Triton's JIT hooks itself."""
    global _hooks_installed
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or runtime.jit_cache_hook is not None \
            or runtime.jit_post_compile_hook is not None:
        return
    runtime.jit_cache_hook = _before_compile
    runtime.jit_post_compile_hook = _after_compile
    _hooks_installed = True


# compile processes at most: each imports torch and the kernels' modules (a few hundred MB)
MAX_COMPILE_PROCESSES = 16


def compile_workers() -> int:
    """Deferred variants that compile at once: the cores this process may use."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


# Deferral leans on Triton's internals (the hook's arguments, JITFunction.preload, the
# async compile mode's submit): the versions it was tested with.
DEFERRAL_TRITON_VERSIONS = ("3.6.",)


def can_defer() -> bool:
    """Whether this Triton is one deferral was tested with (elsewhere variants compile as
    they launch: slower start-ups, the same kernels)."""
    return triton is not None and triton.__version__.startswith(DEFERRAL_TRITON_VERSIONS)


@contextmanager
def deferred_compiles(workers: int | None = None,
                      meanwhile: Callable[[], object] | None = None) -> Iterator[dict]:
    """Inside the block, a Triton kernel that this thread launches and whose variant is not
    compiled yet, nor in Triton's disk cache, is neither compiled nor launched (what it would
    write stays as it was): the variant is noted in the dict the block receives (its size
    tells a pass which of its parts met new variants). On leaving the block (without an
    exception), the noted variants compile ``workers`` at a time (default
    ``compile_workers()``) while this thread runs ``meanwhile`` (if given; its own Triton
    launches compile as they come), then join the kernels' caches, so a launch of one later
    finds it compiled. They compile in up to ``MAX_COMPILE_PROCESSES`` processes
    (``hifc.layers.triton_compile_process``), started at the first variant met so that they
    start up while the block runs on, where they can, else in threads. For start-up passes
    that run once to meet their kernels, then again for real where they met new ones (their
    outputs in the first run are meaningless: a part that met none ran for real).

    Where Triton cannot defer (not installed, its interpreter, its JIT hooks set by the
    application, a version deferral was not tested with) or another thread defers already,
    the block runs as it would outside (its kernels compile as they launch) and notes
    nothing; ``meanwhile`` then runs on leaving. A block inside another of the same thread is
    refused: its pass would find nothing compiled at its end."""
    global _deferring
    if _deferring is not None and _deferring.thread == threading.get_ident():
        raise RuntimeError("deferred_compiles blocks do not nest")
    workers = workers or compile_workers()
    deferral = _Deferral(threading.get_ident(), workers, {})
    try:
        if _hooks_installed and not interpreting() and _deferring is None and can_defer():
            _deferring = deferral
            try:
                yield deferral.noted
            finally:
                _deferring = None
        else:
            yield deferral.noted
        if deferral.noted:
            _compile_all(list(deferral.noted.values()), workers, meanwhile,
                         deferral.processes)
        elif meanwhile is not None:
            meanwhile()
    finally:
        if deferral.processes is not None:
            deferral.processes.close()


def meet_kernels(parts: Iterable[Callable[[], object]], every: bool = False,
                 meanwhile: Callable[[], object] | None = None) -> list[int]:
    """Run each part (taken from ``parts`` one at a time, so a generator may prepare each as it
    comes) once within ``deferred_compiles``, which compiles the variants they met on leaving
    (while this thread runs ``meanwhile``, if given); the indices of the parts to run again for
    real: those that met a variant no part before them met, so that each variant then runs
    once for real (a part that met only compiled or cached variants ran for real; one that
    also met variants an earlier part met first ran without those: a pass whose outputs are
    thrown away), or every part with ``every`` (tensor-parallel ranks, which run the same
    parts, so that their collectives pair up whatever each rank had compiled before)."""
    again = []
    with deferred_compiles(meanwhile=meanwhile) as met:
        for index, part in enumerate(parts):
            known = len(met)
            part()
            if every or len(met) > known:
                again.append(index)
    return again


def _compile_all(variants: list[tuple[object, str]], workers: int,
                 meanwhile: Callable[[], object] | None = None,
                 processes: CompileProcesses | None = None) -> None:
    """Compile each (JITFunction, specialisation data) side by side, ``workers`` at a time,
    running ``meanwhile`` on this thread as they compile; they join their kernels' caches at
    the end. With ``processes``, the variants a process can compile (``importable``) compile
    there, into Triton's file cache, and a pool of threads loads each from there once its
    process is done; the others compile in those threads."""
    from triton.runtime import _async_compile
    started = time.perf_counter()
    threads = min(workers, len(variants))
    ended: list[float] = []  # each compilation's end, in the pool
    jobs = [processes.submit(source, function.cache_key, data)
            if processes is not None and (source := importable(function)) is not None else None
            for function, data in variants]
    with ThreadPoolExecutor(threads) as pool, _TimedCompileMode(pool, ended) as mode:
        for (function, data), job in zip(variants, jobs):
            mode.process_job = job  # the compilation this preload submits waits for it
            function.preload(data)  # submitted to the pool; joined when the mode closes
            mode.process_job = None
        if meanwhile is not None:
            other = time.perf_counter()
            token = _async_compile.active_mode.set(None)  # this thread compiles as it launches
            try:
                meanwhile()
            finally:
                _async_compile.active_mode.reset(token)
            other = time.perf_counter() - other
    log.info("compiled %d deferred kernel variants in %.1f s (%d of them in %d processes, "
             "%d threads)%s", len(variants), max(ended, default=started) - started,
             sum(job is not None for job in jobs), processes.count if processes else 0,
             threads,
             f", beside {other:.1f} s of other start-up work" if meanwhile is not None else "")


def _wait_for(job: Future) -> None:
    """Wait for a compile process's job; whatever went wrong there, this process compiles the
    variant itself (and raises a compilation's own error as it would have)."""
    try:
        job.result()
    except Exception as exc:  # noqa: BLE001 (a compile error is raised again here)
        log.info("a compile process did not compile a variant (%s); compiling it here", exc)


if triton is not None:
    class _TimedCompileMode(triton.AsyncCompileMode):
        """Triton's ``AsyncCompileMode``, noting when each compilation in the pool ends (in
        ``ended``, and as ``_compiled_at`` while it joins its kernel's cache, so that its
        recorded duration is the compilation's, not the wait for the pool's end). A compilation
        submitted while ``process_job`` is set waits for that job (a compile process's) first,
        and then mostly loads from Triton's file cache."""

        def __init__(self, executor, ended: list[float]):
            super().__init__(executor)
            self.ended = ended
            self.process_job: Future | None = None

        def submit(self, key, compile_fn, finalize_fn):
            at: list[float] = []
            job = self.process_job

            def timed():
                try:
                    if job is not None:
                        _wait_for(job)
                    return compile_fn()
                finally:
                    at.append(time.perf_counter())
                    self.ended.append(at[0])

            def finalize(kernel):
                global _compiled_at
                _compiled_at = at[0] if at else None
                try:
                    finalize_fn(kernel)
                finally:
                    _compiled_at = None

            return super().submit(key, timed, finalize)

        def __exit__(self, exc_type, exc_value, traceback):
            from triton.runtime import _async_compile
            try:
                return super().__exit__(exc_type, exc_value, traceback)
            finally:  # Triton's leaves the mode active when a compilation raised
                _async_compile.active_mode.set(None)

    _install_hooks()
