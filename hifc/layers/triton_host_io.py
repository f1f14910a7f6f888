"""A decode step's transfers between pinned host memory and the device as Triton kernels rather
than copy-engine copies.

A padded decode step used to cross the copy engine three times: its packed inputs and the
index of its pending tokens went host -> device, and its sampled ids device -> host, around
a gather, a conversion and an index copy that put the pending tokens into the inputs. Each
switch between a kernel and a copy-engine transfer left the device idle for 2-7 us (8B
preset at batch 1 on an H200: 35 us of idle time per 4.29 ms step, docs/RESULTS.md). Pinned
host memory is mapped into the device's address space, so a kernel can read and write it
directly (PCIe reads and posted writes):

- ``load_packed`` copies a packed step (``hifc.runtime.inputs``' layouts) into the device
  buffer its CUDA graphs read: the fields before the block tables whole, and of each row's
  block table only the entries its sequence length reaches (a table row is as wide as
  ``max_model_len`` allows: 2,048 entries at 131,072 tokens in 64-token blocks, of which a
  4k-token context reads 64). An input id below zero is a pending token, ``-1 - r`` for row
  ``r`` of the previous step's sampled ids (on the device), which it reads in their place.
- ``store_to_host`` writes a small device tensor into pinned host memory.

On H100s and an H200 batch-1 decode steps of the 8B preset took 12-27 us less so (0.2-0.5%)
and batch-32 steps 19-44 us less; the block tables' width made no visible difference at
64-token blocks (docs/RESULTS.md).

Pinned memory is written and read by the host only once the kernel that reads or writes it
has completed (an event after it). Variants do not depend on the sizes or alignments of their
arguments: each kernel compiles once. A pageable host tensor is refused by Triton's launcher
(it is not mapped). Imports without Triton; ``usable`` then says False.
"""
from __future__ import annotations

import torch

from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton

BLOCK = 1024  # elements per program (and per pass of a block table row)


@_jit(do_not_specialize=["header_len", "ids_len", "seq_lens_at", "max_blocks", "block_size",
                         "num_header_programs"],
      do_not_specialize_on_alignment=["host_ptr", "dev_ptr", "sampled_ptr"])
def _load_packed_kernel(host_ptr, dev_ptr, sampled_ptr, header_len, ids_len, seq_lens_at,
                        max_blocks, block_size, num_header_programs, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < num_header_programs:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        inside = offs < header_len
        values = tl.load(host_ptr + offs, mask=inside, other=0)
        pending = inside & (offs < ids_len) & (values < 0)
        sampled = tl.load(sampled_ptr + (-1 - values), mask=pending, other=0)
        tl.store(dev_ptr + offs, tl.where(pending, sampled.to(tl.int32), values), mask=inside)
    else:
        row = pid - num_header_programs
        used = tl.cdiv(tl.load(host_ptr + seq_lens_at + row), block_size)
        base = header_len + row.to(tl.int64) * max_blocks  # the tables follow the header
        for start in range(0, used, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            inside = offs < used
            tl.store(dev_ptr + base + offs, tl.load(host_ptr + base + offs, mask=inside),
                     mask=inside)


@_jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["src_ptr", "dst_ptr"])
def _store_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=inside), mask=inside)


def usable(device: torch.device) -> bool:
    """Whether steps on ``device`` move through these kernels: CUDA with Triton."""
    return triton is not None and device.type == "cuda"


def load_packed(host: torch.Tensor, device_buffer: torch.Tensor, sampled: torch.Tensor,
                header_len: int, ids_len: int, seq_lens_at: int, num_rows: int,
                max_blocks: int, block_size: int) -> None:
    """Copy a packed step from ``host`` (pinned int32) into ``device_buffer`` (int32, as
    large): elements [0, header_len) (the input ids among them at [0, ids_len), pending ones
    read from ``sampled``, int64 on the device) and, of the ``num_rows`` block table rows of
    ``max_blocks`` entries from ``header_len`` on, the first ceil(seq_len / block_size) of
    each, row r's seq_len being element ``seq_lens_at + r``."""
    if not host.dtype == device_buffer.dtype == torch.int32 or sampled.dtype != torch.int64:
        raise ValueError(f"load_packed copies int32 into int32 and reads int64 pending ids, got "
                         f"{host.dtype}, {device_buffer.dtype} and {sampled.dtype}")
    end = header_len + num_rows * max_blocks
    if not (ids_len <= header_len and seq_lens_at + num_rows <= header_len
            and end <= min(host.numel(), device_buffer.numel())):
        raise ValueError(f"a packed step of {end} elements (header {header_len}) does not fit "
                         f"buffers of {host.numel()} and {device_buffer.numel()}")
    header_programs = triton.cdiv(header_len, BLOCK)
    _load_packed_kernel[(header_programs + num_rows,)](
        host, device_buffer, sampled, header_len, ids_len, seq_lens_at, max_blocks, block_size,
        header_programs, BLOCK=BLOCK)


def store_to_host(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Write ``src`` (contiguous, on the device) into the first elements of ``dst`` (pinned,
    contiguous, the same dtype); returns that part of ``dst``, valid on the host once the
    kernel has completed."""
    n = src.numel()
    if not (src.dtype == dst.dtype and src.is_contiguous() and dst.is_contiguous()
            and n <= dst.numel()):
        raise ValueError(f"store_to_host writes a contiguous tensor into contiguous memory of "
                         f"its dtype and at least its size, got {src.dtype} {n} into "
                         f"{dst.dtype} {dst.numel()}")
    out = dst.view(-1)[:n].view(src.shape)
    if n:
        _store_kernel[(triton.cdiv(n, BLOCK),)](src, out, n, BLOCK=BLOCK)
    return out
