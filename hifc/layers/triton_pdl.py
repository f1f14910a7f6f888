"""Programmatic dependent launch (Hopper and later) for the decode chain's Triton kernels.

A kernel launched with PDL may be scheduled while the kernel before it in the stream still
runs, as soon as every program of that kernel has released its dependents; it then waits in
``griddepcontrol.wait`` until that kernel has completed and its writes are visible. In the
meantime it can do what needs nothing the step computes: prefetch its weights (and cache lines
of K/V written in earlier steps) into L2. At small decode batches a step is a chain of short
launches, each paying its ramp-up after the one before it drains; with PDL that ramp-up
overlaps the previous kernel's tail.

The RMSNorm, SiLU-and-mul, small-M projection, KV-write (with or without RoPE), paged
attention and split-KV merge kernels launch with it, and of the one-row GEMVs the O projection
(after the attention) and the gate-up projection after it. The QKV and down GEMVs do not: with
every GEMV launched early batch-1 steps were slower (8B preset, H200: 4.75 ms per step with
every kernel on PDL, 4.55 with none, 4.44 with all but the GEMV; batch 32 8.94 against 9.33;
docs/RESULTS.md). They release their dependents as they start (``release``), so a PDL kernel
after them (the attention after the QKV projection) launches early all the same.

The contract each such kernel keeps: before the wait it reads only what no kernel of the current
step writes (weights, rotary tables, the step's inputs, loaded before the step's first kernel,
which is not launched with PDL) and it writes nothing; L2 prefetches of anything are allowed (L2
is the point of coherence, so a line prefetched before a write is never stale). Every program
waits, and a kernel's wait returns only once the kernel before it has completed, which it cannot
do before its own wait returned: so the order holds however far ahead kernels launch. The
attention kernels and the KV write without RoPE release their dependents right after the wait
(``enter``), so a kernel after them launches only once they run. The RoPE + KV-write, RMSNorm
and SiLU-and-mul kernels, the small-M projection and the PDL GEMVs release them first
(``enter_releasing_first``): the kernels after them then launch and prefetch their weights (the
attention its K/V) while the one before them still runs (8B decode steps at batch 32 and 1,024
keys 0.4-0.5% shorter on H100s, docs/RESULTS.md).

``HIFC_PDL=0`` in the environment turns it off (the kernels then wait for each other as
ordinary launches do). Under Triton's interpreter, off CUDA or before compute capability 9.0
it is off.
"""
from __future__ import annotations

import functools
import os

import torch

from hifc.layers.triton_jit import interpreting, tl, triton
from hifc.layers.triton_jit import jit as _jit

if triton is not None:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
else:  # CPU-only install: the kernels that call these never compile
    gdc_launch_dependents = gdc_wait = None

LINE_BYTES = 128  # an L2 cache line

_enabled: dict[int, bool] = {}


def _index(device: torch.device) -> int:
    """A CUDA device's index (the current device where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def enabled(device: torch.device) -> bool:
    """Whether kernels on this device launch with PDL."""
    if triton is None or device.type != "cuda" or interpreting():
        return False
    index = _index(device)
    if index not in _enabled:
        _enabled[index] = (torch.cuda.get_device_capability(index)[0] >= 9
                           and os.environ.get("HIFC_PDL", "1") != "0")
    return _enabled[index]


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The SMs of a CUDA device (what launch plans divide their programs over)."""
    return _sm_count(_index(device))


def options(pdl: bool) -> dict:
    """A kernel launch's keywords for ``pdl``: its PDL constexpr and, when on, the launch
    attribute."""
    return dict(PDL=True, launch_pdl=True) if pdl else dict(PDL=False)


def launch_options(device: torch.device) -> dict:
    """``options`` for a launch on ``device``."""
    return options(enabled(device))


@_jit
def prefetch_l2(ptrs, mask):
    """Prefetch into L2 the cache lines holding ``ptrs`` where mask (one instruction per
    element: give one pointer per line)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; } // $0",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@_jit
def prefetch_rows(ptr, offs_row, row_ok, stride_row, LINES: tl.constexpr):
    """Prefetch into L2 the first LINES cache lines (128 bytes) of each row offs_row (where
    row_ok) of a matrix whose rows start stride_row elements apart."""
    per_line: tl.constexpr = 1024 // ptr.dtype.element_ty.primitive_bitwidth  # 128 bytes
    lines = tl.arange(0, LINES)
    prefetch_l2(ptr + offs_row[:, None].to(tl.int64) * stride_row + lines[None, :] * per_line,
                row_ok[:, None] & (lines[None, :] < LINES))


def prefetch_lines(row_elements: int, element_size: int, elements: int) -> int:
    """How many cache lines hold the first ``elements`` of a row (at most the row), rounded
    down to a power of two as a tile's width must be (so every line starts inside the row)."""
    count = -(-min(elements, row_elements) * element_size // LINE_BYTES)
    return 1 << (max(1, count).bit_length() - 1)


@_jit
def enter():
    """Wait for the kernel before this one to complete, then let the next one launch."""
    gdc_wait()
    gdc_launch_dependents()


@_jit
def release():
    """Let the next kernel launch (it still waits for this one to complete)."""
    gdc_launch_dependents()


@_jit
def enter_releasing_first():
    """Let the next kernel launch, then wait for the one before this one to complete."""
    gdc_launch_dependents()
    gdc_wait()
