"""Projections of one to a few rows (small decode batches' ``x W^T``) through Triton kernels
that stream the weight: a GEMV for one row, optionally computing its input on the way (RMSNorm
of ``x + residual``, or ``silu(gate) * up``), and a small-M kernel for 2..MAX_ROWS rows.

At M = 1 a projection reads its whole weight for one output row, so it runs at the rate its
weight streams from memory. cuBLAS reads the 8B preset's smaller weights well below that rate;
this kernel gives each program BLOCK_N output rows, sums them over all of K in BLOCK_K slices in
float32 without tensor cores (three loads in flight), and adds the bias. 8B shapes on an H200,
each weight read from HBM (scripts/gpu_kernel_probe.py --parts gemv, docs/RESULTS.md), cuBLAS
against this kernel: QKV 17.5 / 14.2 us, O 13.2 / 10.1 us, down 31.1 / 28.5 us, gate-up 54.6 /
54.9 us.

At one row the elementwise kernels between projections are mostly launch latency, so two of
them run inside the GEMV that reads their output, saving their launches:

- ``gemv_rms_norm`` (a decoder layer's input norm before its QKV projection): each program first
  sums the squares of ``s = x + residual`` (a few KiB from L2), then normalizes each K slice as
  it reads it; program 0 also stores ``s``, the residual stream the next sub-layer adds to. It
  rounds as ``triton_fused.rms_norm`` does (compiled without FMA contraction, as that is), so
  the projection's input is the two-launch path's up to the order the squares are summed. (Before
  the gate-up projection, whose 1,792 programs each repeat that sum, it saved nothing.)
- ``gemv_silu_mul`` (the down projection): the input slice is ``silu(gate) * up`` of the merged
  gate/up output, SiLU through the fast exp and division (every program computes every element:
  torch's IEEE division made the 32B preset's down projection compute-bound), so an element
  may differ from ``silu_and_mul``'s in its last bit.
- ``gemv_add_sumsq`` then ``gemv_norm_sumsq`` (the O projection, the post-attention norm, the
  gate-up projection): the O GEMV adds the residual to its output, stores that sum, and each
  program stores the sum of squares of its features; the gate-up GEMV normalizes its input
  from the sum of those partials rather than summing all K squares in each of its programs.
  Two launches where there were three (8B, 68.8 -> 67.9 us per layer); as ``rms_norm`` up to
  the order the squares are summed.

From 2 to MAX_ROWS rows (the padded decode batches 2, 4, 8 and 16) the weight still dominates
the bytes, and cuBLAS again reads it below the copy rate. ``gemm_rows`` runs the rows as one
16-row tile on tensor cores (rows past M masked, never read) against 32 or 64 weight rows per
program, four loads in flight (``rows_config``). Probe, 8B projections at M = 4 (us, cuBLAS /
this kernel): QKV 15.6 / 15.2, O 13.3 / 11.2, down 32.4 / 30.2; in the engine, decode steps at
batch 2-16 run 1.3-2.2% faster (8B) and 1.7-3.5% (32B at batch 4 and 16). It also takes 25..32
rows in a 32-row tile (batch 32), where it is launched with PDL as the kernels around it are and
cuBLASLt is not (``FULL_TILE_ROWS``). Wide weights (the QKV and gate-up projections) swap the
product's sides, so that the weight tile, not the row tile, is the MMA's M side: Hopper then
runs wgmma straight from shared memory rather than mma.sync through registers (8B gate-up at 32
rows 83.0 -> 78.6 us on an H100; decode steps at batch 32 0.9-1.7% faster on two H100s,
docs/RESULTS.md).

The QKV and down GEMVs are not launched with PDL (``triton_pdl``), but they release their
dependents as they start: the attention after the QKV projection, launched with PDL, then takes
the SMs the GEMV's programs leave and prefetches its first K/V tile while the weight streams
(8B batch-1 forwards 0.5-1.4% shorter on an H100 and an H200, docs/RESULTS.md). The O GEMV
(``gemv_add_sumsq``, after the attention) and the gate-up GEMV after it (``gemv_norm_sumsq``)
are launched with PDL (8B batch-1 steps 0.2-0.3% shorter on H100s, not measured on an H200;
with every GEMV on PDL they were 2% longer). They and the small-M kernel release their dependents
before they wait for the kernel before them (``triton_pdl``).

Float32 sums run in another order than cuBLAS's, so results differ from ``F.linear`` in the last
bits; every projection of 16-bit rows on CUDA whose count ``takes_rows`` or is one and whose K is
a multiple of 512 takes these paths, whether in a CUDA graph or not. Imports without Triton; the
``usable`` checks then say False.
"""
from __future__ import annotations

import torch

from hifc.layers import triton_pdl
from hifc.layers.triton_fused import norm_weighted, round_to
from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton
from hifc.layers.triton_pdl import enter_releasing_first, prefetch_rows, release

BLOCK_N = 16
BLOCK_K = 512
NUM_STAGES = 3
NUM_WARPS = 4

# 2..MAX_ROWS rows take the small-M kernel: tensor cores over one tile of rows_block_m(M) rows
# (rows past M masked, never read), and so do FULL_TILE_ROWS..32 rows, a 32-row tile at most a
# fifth masked. Alone (the probe) it read the weights no faster than cuBLASLt at 24 and 32 rows,
# but launched with PDL after the kernel before it, batch 32's decode steps ran 1.7-2.8% faster
# through it on an H100 (level to 0.3% slower on an H200, whose cuBLASLt reads these weights
# nearer its copy rate) and batch 24's (a third of the tile masked) 2% slower
# (docs/RESULTS.md): 17..24 rows keep cuBLASLt.
MAX_ROWS = 16
FULL_TILE_ROWS = 25
ROWS_K_MULTIPLE = 512  # K a multiple of this fits every configuration rows_config gives
ROWS_SHARED_BYTES = 200 * 1024  # the stages' tiles stay within this much shared memory
# The small-M kernel is launched with PDL (triton_pdl; of the one-row GEMVs only the O and
# gate-up ones are, see the module doc): a program prefetches this many K slices of its weight
# rows into L2 while the kernel before it finishes.
PREFETCH_SLICES = 2
# From this many output features the small-M kernel takes the weight tile as the MMA's M side
# (``rows_config``), and from SWAP_WIDE_N on in 128-row tiles where their last wave of programs
# leaves no more SMs idle than 64-row tiles' would.
SWAP_MIN_N = 96 * 64
SWAP_WIDE_N = 160 * 64


def rows_block_m(m: int) -> int:
    """The small-M kernel's row tile for M rows (at most 32): 16 or 32."""
    if not 1 <= m <= 32:
        raise ValueError(f"the small-M kernel takes 1..32 rows, got {m}")
    return 16 if m <= 16 else 32


def _fills_as_well(rows: int, other: int, n: int, sms: int) -> bool:
    """Whether programs of ``rows`` weight rows fill at least as large a share of the SM slots
    over their waves as programs of ``other`` rows, one program per SM (what the swapped
    tiles' shared memory allows)."""
    programs, other_programs = -(-n // rows), -(-n // other)
    slots, other_slots = (-(-p // sms) * sms for p in (programs, other_programs))
    return programs * other_slots >= other_programs * slots


def rows_config(n: int, m: int = 2, sms: int | None = None) -> dict[str, int]:
    """The small-M kernel's launch configuration for N output features and M rows on a device
    of ``sms`` SMs (None: not considered).

    From SWAP_MIN_N features on, the weight tile is the MMA's M side (``swap``; on Hopper
    that runs wgmma, where a row tile of 16 or 32 as the M side runs mma.sync): 64 weight rows
    per program in 256-wide K slices, three loads in flight. Past SWAP_WIDE_N features, 128
    rows in 128-wide slices, four in flight, unless their waves of programs fill fewer of the
    SMs than 64-row tiles' would (the probe's sweep on an H100 chose 128 rows for the 8B
    gate-up, 224 programs on 132 SMs, a share as good as 448 64-row programs'; the 32B gate-up's
    432 128-row programs leave most SMs of a fourth wave idle, and its batch-16 decode steps
    took 0.4% longer in them than in 864 of 64 rows, docs/RESULTS.md). Below SWAP_MIN_N (the
    8B O and down projections, where 64-row programs would be too few for the SMs) 64 weight
    rows in 256-wide slices, or 32 rows in 512-wide slices where 64-row tiles would be fewer
    than 80 programs; four loads in flight where their tiles fit the shared memory, else
    three."""
    if n >= SWAP_WIDE_N and (sms is None or _fills_as_well(128, 64, n, sms)):
        return dict(block_n=128, block_k=128, stages=4, warps=4, swap=True)
    if n >= SWAP_MIN_N:
        return dict(block_n=64, block_k=256, stages=3, warps=4, swap=True)
    config = (dict(block_n=64, block_k=256) if n >= 80 * 64 else dict(block_n=32, block_k=512))
    tile_bytes = (rows_block_m(m) + config["block_n"]) * config["block_k"] * 2
    return dict(config, stages=4 if 4 * tile_bytes <= ROWS_SHARED_BYTES else 3, warps=4,
                swap=False)


# what the kernel computes its input from
_PLAIN, _RMS_NORM, _SILU_MUL, _NORM_SUMSQ = 0, 1, 2, 3


@_jit
def _gemv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, N, stride_wn,
                 residual_ptr, norm_weight_ptr, summed_ptr, sumsq_ptr, num_partials, eps,
                 K_STEPS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 STAGES: tl.constexpr, HAS_BIAS: tl.constexpr, PROLOGUE: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr, UNIT_OFFSET: tl.constexpr,
                 NORM_BLOCK: tl.constexpr, ADD_SUMSQ: tl.constexpr, RELEASE: tl.constexpr,
                 PDL: tl.constexpr):
    if PDL:  # launched with PDL: let the next kernel launch, then wait for the one before
        enter_releasing_first()
    elif RELEASE:  # let a PDL-launched kernel after this one start and prefetch meanwhile
        release()
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    K = K_STEPS * BLOCK_K
    dtype = x_ptr.dtype.element_ty
    if PROLOGUE == 1:  # 1 / rms(x + residual), as triton_fused.rms_norm computes it
        offs = tl.arange(0, NORM_BLOCK)
        ok = offs < K
        s = tl.load(x_ptr + offs, mask=ok, other=0.0)
        if HAS_RESIDUAL:
            s = (s.to(tl.float32) + tl.load(residual_ptr + offs, mask=ok,
                                            other=0.0).to(tl.float32)).to(dtype)
            tl.store(summed_ptr + offs, s, mask=ok & (pid == 0))
        h = s.to(tl.float32)
        inv_rms = tl.math.rsqrt(tl.sum(h * h, axis=0) / K + eps)
    elif PROLOGUE == 3:  # 1 / rms(x) from the partial sums of its squares
        offs = tl.arange(0, NORM_BLOCK)
        partials = tl.load(sumsq_ptr + offs, mask=offs < num_partials, other=0.0)
        inv_rms = tl.math.rsqrt(tl.sum(partials, axis=0) / K + eps)
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for step in tl.range(0, K_STEPS, num_stages=STAGES):
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        k = step * BLOCK_K + offs_k
        if PROLOGUE == 0:
            x = tl.load(x_ptr + k).to(tl.float32)
        elif PROLOGUE == 1 or PROLOGUE == 3:
            s_k = tl.load(x_ptr + k)
            if PROLOGUE == 1 and HAS_RESIDUAL:
                s_k = (s_k.to(tl.float32) + tl.load(residual_ptr + k).to(tl.float32)).to(dtype)
            nw = tl.load(norm_weight_ptr + k).to(tl.float32)
            x = round_to(norm_weighted(s_k.to(tl.float32) * inv_rms, nw, dtype, UNIT_OFFSET),
                         dtype)
        else:  # x_ptr is [gate | up], each K wide
            gate = tl.load(x_ptr + k).to(tl.float32)
            up = tl.load(x_ptr + K + k).to(tl.float32)
            # fast exp and division (each K element is computed by every program, and the
            # precise ones made a 32B down projection compute-bound): float32 SiLU within a few
            # ulps of torch's, rounded to the dtype as silu_and_mul rounds it
            x = round_to(round_to(gate / (1.0 + tl.exp(-gate)), dtype) * up, dtype)
        acc += w.to(tl.float32) * x[None, :]
        w_ptrs += BLOCK_K
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    out = out.to(out_ptr.dtype.element_ty)
    if ADD_SUMSQ:  # out + residual as rms_norm adds it, and this program's sum of its squares
        out = (out.to(tl.float32) + tl.load(residual_ptr + offs_n, mask=n_ok,
                                            other=0.0).to(tl.float32)).to(out.dtype)
        h = out.to(tl.float32)
        tl.store(sumsq_ptr + pid, tl.sum(h * h, axis=0))
    tl.store(out_ptr + offs_n, out, mask=n_ok)


@_jit
def _rows_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_om,
                 K_STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, STAGES: tl.constexpr, HAS_BIAS: tl.constexpr,
                 SWAP: tl.constexpr, PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    if PDL:
        prefetch_rows(w_ptr, offs_n, n_ok, stride_wn, PREFETCH_LINES)
        enter_releasing_first()
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    if SWAP:  # out^T = W x^T: the weight tile is the MMA's M side (wgmma on Hopper)
        xt_ptrs = x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None]
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for _ in tl.range(0, K_STEPS, num_stages=STAGES):
            xt = tl.load(xt_ptrs, mask=m_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            acc_t = tl.dot(w, xt, acc_t)
            xt_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            acc_t += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None],
                 acc_t.to(out_ptr.dtype.element_ty), mask=m_ok[None, :] & n_ok[:, None])
    else:
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in tl.range(0, K_STEPS, num_stages=STAGES):
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            acc = tl.dot(x, tl.trans(w), acc)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _rows_fit(x: torch.Tensor, weight: torch.Tensor, width: int, max_rows: int,
              k_multiple: int) -> bool:
    """1..max_rows contiguous 16-bit rows x of ``width`` on CUDA, a weight of their dtype
    contiguous along K, K a multiple of k_multiple."""
    return (triton is not None and x.is_cuda and x.dim() == 2 and 1 <= x.shape[0] <= max_rows
            and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype
            and x.stride(-1) == 1 and weight.stride(-1) == 1 and x.shape[1] == width
            and weight.shape[1] % k_multiple == 0)


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True for one 16-bit row x ([1, K]) on CUDA against a weight ([N, K]) of its dtype,
    contiguous along K, with K a multiple of BLOCK_K."""
    return _rows_fit(x, weight, weight.shape[1], 1, BLOCK_K)


def takes_rows(m: int) -> bool:
    """Whether the small-M kernel takes a product of m rows: 2..MAX_ROWS or FULL_TILE_ROWS..32."""
    return 2 <= m <= MAX_ROWS or FULL_TILE_ROWS <= m <= 32


def row_variants(max_rows: int) -> list[int]:
    """A row count for each variant of the small-M kernel that products of at most max_rows
    rows compile: per row tile (``rows_block_m``), M a multiple of 16 or not (Triton
    specializes an integer argument on that)."""
    variants = {}
    for m in range(2, min(max_rows, 32) + 1):
        if takes_rows(m):
            variants.setdefault((rows_block_m(m), m % 16 == 0), m)
    return list(variants.values())


def usable_rows(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True for 16-bit rows x ([M, K], contiguous along K; M as ``takes_rows`` takes it) on
    CUDA against a weight ([N, K]) of its dtype, contiguous along K, with K a multiple of the
    rows kernel's K slice."""
    return (x.dim() == 2 and takes_rows(x.shape[0])
            and _rows_fit(x, weight, weight.shape[1], 32, ROWS_K_MULTIPLE))


def usable_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                    weight: torch.Tensor) -> bool:
    """``usable(x, weight)``, and a residual (if any) and norm weight ([K]) of x's dtype and
    shape, contiguous."""
    return (usable(x, weight) and norm_weight.dtype == x.dtype
            and norm_weight.shape == (x.shape[1],) and norm_weight.stride(0) == 1
            and (residual is None or (residual.dtype == x.dtype and residual.shape == x.shape
                                      and residual.stride(-1) == 1)))


def usable_silu_mul(gate_up: torch.Tensor, weight: torch.Tensor) -> bool:
    """True for one 16-bit row gate_up = [gate | up] ([1, 2K]) against a weight ([N, K]) as
    ``usable`` takes them."""
    return _rows_fit(gate_up, weight, 2 * weight.shape[1], 1, BLOCK_K)


def _launch(x, weight, bias, out, prologue, *, residual=None, norm_weight=None, summed=None,
            sumsq=None, add_sumsq=False, eps=0.0, unit_offset=False, pdl=False,
            block_n=BLOCK_N, block_k=BLOCK_K, stages=NUM_STAGES, warps=NUM_WARPS):
    n, k = weight.shape
    if out is None:
        out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    # the plain GEMV keeps FMA contraction (with add_sumsq too: its product is the plain
    # GEMV's); the fused inputs round as the separate kernels
    fused_input = prologue != _PLAIN
    pdl_on = triton_pdl.enabled(x.device)
    num_partials = sumsq.shape[0] if sumsq is not None else 0
    norm_block = (triton.next_power_of_2(num_partials) if prologue == _NORM_SUMSQ
                  else triton.next_power_of_2(k))
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight, weight if bias is None else bias, out, n, weight.stride(0),
        x if residual is None else residual, x if norm_weight is None else norm_weight,
        x if summed is None else summed, out if sumsq is None else sumsq, num_partials, eps,
        K_STEPS=k // block_k, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages,
        HAS_BIAS=bias is not None, PROLOGUE=prologue, HAS_RESIDUAL=residual is not None,
        UNIT_OFFSET=unit_offset, NORM_BLOCK=norm_block, ADD_SUMSQ=add_sumsq,
        RELEASE=pdl_on, **triton_pdl.options(pdl and pdl_on), num_warps=warps,
        enable_fp_fusion=not fused_input)
    return out


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
         out: torch.Tensor | None = None, block_n: int = BLOCK_N, block_k: int = BLOCK_K,
         stages: int = NUM_STAGES, warps: int = NUM_WARPS) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for inputs ``usable`` accepts -> [1, N] (into ``out`` if
    given); the launch configuration is the module's unless given (K a multiple of block_k)."""
    return _launch(x, weight, bias, out, _PLAIN, block_n=block_n, block_k=block_k,
                   stages=stages, warps=warps)


def gemm_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
              out: torch.Tensor | None = None, block_n: int | None = None,
              block_k: int | None = None, stages: int | None = None,
              warps: int | None = None, swap: bool | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for inputs ``usable_rows`` accepts -> [M, N] (into ``out``
    if given, contiguous along N); the configuration ``rows_config`` gives unless given."""
    m, k = x.shape
    n = weight.shape[0]
    config = rows_config(n, m, triton_pdl.sm_count(x.device) if x.is_cuda else None)
    block_n = block_n or config["block_n"]
    block_k = block_k or config["block_k"]
    stages = stages or config["stages"]
    warps = warps or config["warps"]
    swap = config["swap"] if swap is None else swap
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _rows_kernel[(triton.cdiv(n, block_n),)](
        x, weight, weight if bias is None else bias, out, m, n, x.stride(0), weight.stride(0),
        out.stride(0), K_STEPS=k // block_k, BLOCK_M=rows_block_m(m), BLOCK_N=block_n,
        BLOCK_K=block_k, STAGES=stages, HAS_BIAS=bias is not None, SWAP=swap,
        PREFETCH_LINES=triton_pdl.prefetch_lines(k, weight.element_size(),
                                                 PREFETCH_SLICES * block_k),
        **triton_pdl.launch_options(x.device), num_warps=warps)
    return out


def gemv_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                  eps: float, unit_offset: bool, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``F.linear(rms_norm(x + residual), weight, bias)`` in one launch for inputs
    ``usable_rms_norm`` accepts; returns it ([1, N]) and ``x + residual`` (x itself without a
    residual), as ``triton_fused.rms_norm`` returns its second value."""
    summed = x if residual is None else torch.empty_like(x)
    out = _launch(x, weight, bias, None, _RMS_NORM, residual=residual, norm_weight=norm_weight,
                  summed=summed, eps=eps, unit_offset=unit_offset)
    return out, summed


def gemv_silu_mul(gate_up: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(silu(gate) * up, weight, bias)`` for gate_up = [gate | up] ([1, 2K]) in one
    launch, for inputs ``usable_silu_mul`` accepts -> [1, N]."""
    return _launch(gate_up, weight, bias, None, _SILU_MUL)


def usable_add_sumsq(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
    """``usable(x, weight)``, and a residual of the product's shape ([1, N]) and x's dtype,
    contiguous."""
    return (usable(x, weight) and residual.dtype == x.dtype
            and residual.shape == (1, weight.shape[0]) and residual.stride(-1) == 1)


def gemv_add_sumsq(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``summed = F.linear(x, weight, bias) + residual`` in one launch (rounded as
    ``triton_fused.rms_norm`` adds its residual) for inputs ``usable_add_sumsq`` accepts, and
    the sums of its squares over each program's BLOCK_N features (float32,
    [cdiv(N, BLOCK_N)]), from which ``gemv_norm_sumsq`` normalizes summed."""
    n = weight.shape[0]
    sumsq = torch.empty(triton.cdiv(n, BLOCK_N), dtype=torch.float32, device=x.device)
    summed = _launch(x, weight, bias, None, _PLAIN, residual=residual, sumsq=sumsq,
                     add_sumsq=True, pdl=True)
    return summed, sumsq


def usable_norm_sumsq(summed: torch.Tensor, norm_weight: torch.Tensor,
                      weight: torch.Tensor) -> bool:
    """``usable(summed, weight)``, and a norm weight ([K]) of summed's dtype, contiguous."""
    return (usable(summed, weight) and norm_weight.dtype == summed.dtype
            and norm_weight.shape == (summed.shape[1],) and norm_weight.stride(0) == 1)


def gemv_norm_sumsq(summed: torch.Tensor, sumsq: torch.Tensor, norm_weight: torch.Tensor,
                    eps: float, unit_offset: bool, weight: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(rms_norm(summed), weight, bias)`` in one launch, the norm's sum of squares
    being the sum of ``sumsq`` (``gemv_add_sumsq``'s), for inputs ``usable_norm_sumsq``
    accepts -> [1, N]."""
    return _launch(summed, weight, bias, None, _NORM_SUMSQ, norm_weight=norm_weight,
                   sumsq=sumsq, eps=eps, unit_offset=unit_offset, pdl=True)
