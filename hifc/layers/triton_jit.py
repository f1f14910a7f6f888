"""Triton where it is installed: ``triton`` and ``tl`` (None without it) and ``jit``, which
compiles a kernel with Triton or, without Triton, leaves the function as it is, so that the
kernel modules import on CPU-only installs (their callers then use the torch code or refuse)."""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None


def jit(fn=None, **options):
    """``triton.jit(fn, **options)``; usable bare (``@jit``) or with options
    (``@jit(do_not_specialize=[...])``)."""
    if fn is None:
        return lambda f: jit(f, **options)
    return triton.jit(fn, **options) if triton is not None else fn
