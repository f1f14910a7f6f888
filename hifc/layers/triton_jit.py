"""Triton where it is installed: ``triton`` and ``tl`` (None without it) and ``jit``, which
compiles a kernel with Triton or, without Triton, leaves the function as it is, so that the
kernel modules import on CPU-only installs (their callers then use the torch code or refuse).

Every compilation in the process (a kernel specialisation's first use: Triton compiles one per
set of compile-time constants and argument properties) is recorded through Triton's JIT hooks,
with its duration: ``kernel_compiles()``. A compile inside a timed region is a first use, not
steady-state speed; the benchmarks report them (one took 2.1-2.4 s on the H200)."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

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
    seconds: float
    # Triton's specialisation data (JSON: signature, constants, argument attributes such as
    # 16-byte divisibility), what sets this compilation apart from the kernel's others
    specialization: str = ""


_compiles: list[KernelCompile] = []
_started: dict[str, float] = {}


def kernel_compiles() -> list[KernelCompile]:
    """The Triton compilations of this process so far, oldest first."""
    return list(_compiles)


def _before_compile(*, key, repr: str, **_) -> None:  # noqa: A002 (Triton's keyword)
    _started[str(key)] = time.perf_counter()
    return None  # a true value would tell Triton to skip the compilation


def _after_compile(*, key, repr: str, compile=None, **_) -> None:  # noqa: A002
    started = _started.pop(str(key), None)
    seconds = time.perf_counter() - started if started is not None else 0.0
    details = (compile or {}).get("specialization_data") or ""
    _compiles.append(KernelCompile(repr, seconds, str(details)))
    log.debug("compiled %s in %.2f s", repr, seconds)
    return None


def _install_hooks() -> None:
    """Record compilations, unless the application set Triton's JIT hooks itself."""
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or runtime.jit_cache_hook is not None \
            or runtime.jit_post_compile_hook is not None:
        return
    runtime.jit_cache_hook = _before_compile
    runtime.jit_post_compile_hook = _after_compile


if triton is not None:
    _install_hooks()
