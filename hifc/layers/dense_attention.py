"""Prompt chunks through torch's fused attention kernels (cuDNN's first), for the Triton backend.

A step whose sequences are some decodes (one new token each) followed by a few prompt chunks,
one of at least ``DENSE_PREFILL_MIN_TOKENS`` tokens, attends its chunks one at a time with the
fused kernels instead of the paged kernel: on the H200 cuDNN ran prompts of 8k and 32k tokens at
590-615 TFLOP/s, the paged kernel at 335-365 (``scripts/gpu_kernel_probe.py``, docs/RESULTS.md).
The decodes stay with the paged kernel.

A fresh prompt (no cached context) is one causal call on the K/V in hand. A chunk of n tokens
after c cached ones (a later chunk of a long prompt, a prompt whose prefix was cached, a
recompute) is two calls, each returning its log-sum-exp: the n queries over the c cached keys
(gathered from the paged cache, no mask) and over their own n keys (causal); one Triton kernel
then merges the two normalised results, weighting each row by the exp of its log-sum-exp.

cuDNN builds an execution graph for each new shape (lengths, heads, strides) it is called with,
which cost ~62-68 ms of host time per shape on the H200 (cuDNN 9.19), more than the fused
kernels save on an 8k-token prompt (~20 ms over 32 layers). A fresh chunk therefore attends in
tensors of its own whose length is rounded up to a multiple of ``DENSE_PAD_TOKENS`` (zero rows
after its own, which the causal mask keeps from every real query), so that prompts of varied
lengths share a few graphs, which start-up builds up to ``PREBUILT_TOKENS`` (``warm_up``;
GovReport-like runs 0.9-1.4% faster on H100s, docs/RESULTS.md). A chunk of a whole padded length
attends in place where its tensor is contiguous. ``FusedShapes`` keeps the rule: a step's chunks
take the fused kernels when all their shapes were built before, when each was seen before (a
length that recurs), or when the attention they save over the model's layers outweighs the
builds (a fresh prompt of ~15k tokens or more on the 8B preset); failing that, the fresh chunks
at the step's end may take them alone, the chunks before them staying with the paged kernel
(``fresh_suffix``). A graph build costs that little once cuDNN has compiled the kernel of each
kind of call: the first call of a kind in a machine compiles it, 0.7-0.9 s on an H100 (later
processes find it on disk), so ``warm_up`` meets every kind at start-up.

Needs 16-bit q/k/v, no sliding window, no soft-capping and a 16-bit cache (the caller checks
those), and cached context of at most MAX_GATHER_BYTES per chunk (128k tokens of the 8B preset).
Host-side lengths decide the calls, so a CUDA graph never takes this path (its chunks are
shorter than DENSE_PREFILL_MIN_TOKENS). On the CPU (Triton's interpreter, tests) torch's
CPU flash kernel stands in for cuDNN.
"""
from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hifc.layers.attention import AttentionMetadata, attend_with_lse
from hifc.layers.triton_jit import jit as _jit
from hifc.layers.triton_jit import tl, triton

DENSE_PREFILL_MIN_TOKENS = 512  # a chunk this long attends through torch's fused kernels
DENSE_PREFILL_MAX_SEQS = 8  # they run once per chunk: no more chunks than this in a step
DENSE_PAD_TOKENS = 512  # a fresh chunk attends in a length rounded up to a multiple of this
PREBUILT_TOKENS = 8192  # start-up builds the fresh chunks' graphs up to this length
# H200, 8B shapes (scripts/gpu_kernel_probe.py --parts builds,dense): a new shape's graph build,
# and the time the fused kernels (~595 TFLOP/s) save per FLOP against the paged kernel (~355)
GRAPH_BUILD_SECONDS = 0.065
SECONDS_SAVED_PER_FLOP = 1 / 355e12 - 1 / 595e12
MAX_TRACKED_SHAPES = 4096  # shapes remembered; past this the record starts again
# a chunk's cached keys and values are gathered into one temporary tensor: at most this large
# (the KV cache was sized leaving room for the model's activations, not for such copies)
MAX_GATHER_BYTES = 512 << 20
# The chunks ``warm_up`` attends: fresh and after cached keys, of lengths that are whole
# 64-token tiles and that are not (a fresh one padded). cuDNN compiles a kernel for each kind of
# call it first meets in a machine (causal or not, with or without the log-sum-exp, lengths
# whole tiles or not): 0.7-0.9 s each on an H100, against ~65 ms for a new shape of a kind met
# before (docs/RESULTS.md).
WARM_UP_TOKENS = (DENSE_PREFILL_MIN_TOKENS, DENSE_PREFILL_MIN_TOKENS + 8)
WARM_UP_CONTEXTS = (0, 1024, 1032)

logger = logging.getLogger(__name__)


class FusedShapes:
    """The fused-kernel shapes this process has built or seen, and the rule for a step."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers  # layers a step's shapes serve once built
        self.seen: dict[tuple, bool] = {}  # shape -> built

    def pays(self, shapes: list[tuple], flops: int) -> bool:
        """Whether calls of these shapes, attending ``flops`` per layer through them, take the
        fused kernels: each shape built or seen before, or the attention saved over the
        model's layers outweighing the new builds. Records nothing."""
        new = [shape for shape in shapes if not self.seen.get(shape)]
        return (all(shape in self.seen for shape in new) or flops * self.num_layers
                * SECONDS_SAVED_PER_FLOP > GRAPH_BUILD_SECONDS * len(set(new)))

    def record(self, shapes: list[tuple], built: bool) -> None:
        """Record the shapes as built (the fused kernels took them) or as seen."""
        if len(self.seen) + len(shapes) > MAX_TRACKED_SHAPES:
            self.seen.clear()
        for shape in shapes:
            self.seen[shape] = self.seen.get(shape, False) or built

    def take(self, shapes: list[tuple], flops: int) -> bool:
        """``pays``, recording the shapes as built if so, as seen if not."""
        take = self.pays(shapes, flops)
        self.record(shapes, take)
        return take


def padded(tokens: int) -> int:
    """The length a fresh chunk of ``tokens`` attends in: a multiple of DENSE_PAD_TOKENS."""
    return -(-tokens // DENSE_PAD_TOKENS) * DENSE_PAD_TOKENS


def _spans(meta: AttentionMetadata) -> list[tuple[int, int, int, int]]:
    """(sequence, first new token, end of its new tokens, cached context) of each sequence."""
    qsl = meta.query_start_loc_cpu
    return [(i, start, end, meta.seq_lens_cpu[i] - (end - start))
            for i, (start, end) in enumerate(zip(qsl, qsl[1:]))]


def dense_chunks_after(meta: AttentionMetadata, dtype: torch.dtype,
                       token_bytes: int) -> int | None:
    """The number of leading decodes when the step's other sequences suit the fused kernels:
    16-bit, 1..DENSE_PREFILL_MAX_SEQS of them, each of at least 2 new tokens, one of at least
    DENSE_PREFILL_MIN_TOKENS, none with more cached context than MAX_GATHER_BYTES hold at
    ``token_bytes`` (a cached token's K and V); None when they do not."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    spans = _spans(meta)
    decodes = next((i for i, start, end, _ in spans if end - start != 1), len(spans))
    chunks = [end - start for _, start, end, _ in spans[decodes:]]
    if (not 1 <= len(chunks) <= DENSE_PREFILL_MAX_SEQS or min(chunks) < 2
            or max(chunks) < DENSE_PREFILL_MIN_TOKENS):
        return None
    longest_context = max(context for *_, context in spans[decodes:])
    return decodes if longest_context * token_bytes <= MAX_GATHER_BYTES else None


def fresh_suffix(meta: AttentionMetadata, first: int) -> int | None:
    """The first sequence of the fresh prompt chunks (no cached context) that end the step
    after sequence ``first``, when they suit the fused kernels on their own (as
    ``dense_chunks_after`` takes chunks) and a chunk over cached context comes before them;
    None otherwise."""
    spans = _spans(meta)
    start = len(spans)
    while start > first and spans[start - 1][3] == 0:
        start -= 1
    chunks = [end - begin for _, begin, end, _ in spans[start:]]
    if (start == first or not 1 <= len(chunks) <= DENSE_PREFILL_MAX_SEQS or min(chunks) < 2
            or max(chunks) < DENSE_PREFILL_MIN_TOKENS):
        return None
    return start


def fresh_shape(length: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                dtype: torch.dtype) -> tuple:
    """The shape of a fresh chunk's call, padded to ``length``: its q, k and v are tensors of
    their own, token-major (``_padded_heads``)."""
    return ("causal", length, (num_q_heads, head_dim), (num_kv_heads, head_dim), dtype,
            num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim)


def chunk_call_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      meta: AttentionMetadata) -> tuple[list[tuple], int]:
    """The fused-kernel calls ``dense_prefill_attention`` makes for these chunks, as the shapes
    cuDNN builds a graph for, and the attention FLOPs of one layer over them (a padded chunk's
    own, not its padding's)."""
    layout = (q.shape[1:], k.shape[1:], q.dtype, q.stride(0), k.stride(0), v.stride(0))
    shapes, pairs = [], 0
    for _, start, end, context in _spans(meta):
        n = end - start
        if n and not context:
            shapes.append(fresh_shape(padded(n), q.shape[1], k.shape[1], q.shape[2], q.dtype))
            pairs += n * (n + 1) // 2
        elif n:
            shapes.append(("causal", n, *layout))
            if context:
                shapes.append(("over context", n, context, *layout))
            pairs += n * context + n * (n + 1) // 2
    return shapes, 4 * q.shape[1] * q.shape[2] * pairs


def dense_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of prompt chunks: q [T, Hq, D], k and v [T, Hkv, D] (the step's new
    tokens, in order; already written to ``kv_cache`` [2, NB, BS, Hkv, D]), each sequence's
    queries over its cached context and its own keys. Without ``out``, a single fresh prompt's
    result is the kernel's own output (cuDNN writes it token-major, so the [T, Hq, D] view
    needs no copy)."""
    spans = [span for span in _spans(meta) if span[2] > span[1]]
    if out is None and (len(spans) != 1 or spans[0][3]):
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for i, start, end, context in spans:
        n = end - start
        if context == 0:
            o = _causal(*(_padded_heads(x[start:end], padded(n)) for x in (q, k, v)), scale)
            if out is None:
                return o[0, :, :n].transpose(0, 1)
            out[start:end] = o[0, :, :n].transpose(0, 1)
            continue
        qs, ks, vs = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        kc, vc = _cached_keys(kv_cache, meta.block_tables[i], context, meta.block_size)
        over_context = attend_with_lse(qs, kc, vc, scale, causal=False)
        over_own = attend_with_lse(qs, ks, vs, scale, causal=True)
        merge_attention(*over_context, *over_own, out[start:end])
    return out


def warm_up(num_q_heads: int, kv_cache: torch.Tensor, scale: float,
            max_chunk_tokens: int = 0) -> list[tuple[int, int, float]]:
    """Attend one chunk of each of WARM_UP_TOKENS after each of WARM_UP_CONTEXTS cached keys
    through the fused kernels, laid out as a step's chunks are (q and k rotated into tensors of
    their own, v a view of the QKV projection's output), the cached keys read from the first
    block of ``kv_cache`` (one layer's, 16-bit; nothing is written), so that the kernels cuDNN
    compiles for them are compiled before a request's step needs them; then a fresh chunk of
    each padded length up to ``max_chunk_tokens`` (a step's most, at most PREBUILT_TOKENS), so
    that cuDNN has built the graphs of a step's fresh chunks. Returns (cached keys, tokens,
    seconds) of each chunk."""
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    device, dtype = kv_cache.device, kv_cache.dtype
    timed = []
    fresh = range(DENSE_PAD_TOKENS, min(padded(max_chunk_tokens), PREBUILT_TOKENS) + 1,
                  DENSE_PAD_TOKENS)
    met = {padded(n) for n in WARM_UP_TOKENS}
    chunks = ([(context, n) for context in WARM_UP_CONTEXTS for n in WARM_UP_TOKENS]
              + [(0, n) for n in fresh if n not in met])
    for context, n in chunks:
        qkv = torch.zeros(n, (num_q_heads + 2 * num_kv_heads) * head_dim, dtype=dtype,
                          device=device)
        q = torch.zeros(n, num_q_heads, head_dim, dtype=dtype, device=device)
        k = torch.zeros(n, num_kv_heads, head_dim, dtype=dtype, device=device)
        v = qkv[:, (num_q_heads + num_kv_heads) * head_dim:].view(n, num_kv_heads, head_dim)
        blocks = -(-(context + n) // block_size)
        meta = AttentionMetadata(
            slot_mapping=torch.zeros(n, dtype=torch.long, device=device),
            query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([context + n], dtype=torch.int32, device=device),
            block_tables=torch.zeros(1, blocks, dtype=torch.int32, device=device),
            query_start_loc_cpu=[0, n], seq_lens_cpu=[context + n], max_query_len=n,
            max_seq_len=context + n, block_size=block_size)
        started = time.perf_counter()
        dense_prefill_attention(q, k, v, kv_cache, meta, scale)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timed.append((context, n, time.perf_counter() - started))
    logger.info("the fused prompt attention met %d chunks (%d kinds, fresh lengths up to %d) "
                "in %.2f s (longest %.2f s)", len(timed),
                len(WARM_UP_CONTEXTS) * len(WARM_UP_TOKENS), max(fresh, default=0),
                sum(t for *_, t in timed), max(t for *_, t in timed))
    return timed


def _padded_heads(x: torch.Tensor, length: int) -> torch.Tensor:
    """A chunk's tokens x ([n, H, D]) as [1, H, length, D] heads, token-major, zero past n: x
    itself where it is that already (n == length, contiguous), else a copy."""
    n = x.shape[0]
    if n == length and x.is_contiguous():
        return x.transpose(0, 1).unsqueeze(0)
    heads = x.new_empty(length, *x.shape[1:])
    heads[:n] = x
    heads[n:].zero_()
    return heads.transpose(0, 1).unsqueeze(0)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])


def _cached_keys(kv_cache: torch.Tensor, block_table: torch.Tensor, context: int,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's first ``context`` cached keys and values, gathered into one tensor:
    [1, Hkv, context, D] views each."""
    blocks = -(-context // block_size)
    kv = kv_cache.index_select(1, block_table[:blocks])  # [2, blocks, BS, Hkv, D]
    kv = kv.flatten(1, 2)[:, :context]  # [2, context, Hkv, D]
    return kv[0].transpose(0, 1).unsqueeze(0), kv[1].transpose(0, 1).unsqueeze(0)


# Not specialised on the strides that follow a chunk's length (a variant per length that is 1,
# a multiple of 16 or neither).
@_jit(do_not_specialize=["o1_h", "lse1_t", "lse1_h", "o2_h", "lse2_t", "lse2_h"])
def _merge_kernel(o1_ptr, lse1_ptr, o2_ptr, lse2_ptr, out_ptr,
                  o1_t, o1_h, lse1_t, lse1_h, o2_t, o2_h, lse2_t, lse2_h, out_t, out_h,
                  HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_ok = h < HEADS
    mask = h_ok[:, None] & (d[None, :] < HEAD_DIM)
    a = tl.load(lse1_ptr + t * lse1_t + h * lse1_h, mask=h_ok, other=0.0)
    b = tl.load(lse2_ptr + t * lse2_t + h * lse2_h, mask=h_ok, other=0.0)
    top = tl.maximum(a, b)
    wa = tl.exp(a - top)
    wb = tl.exp(b - top)
    x = tl.load(o1_ptr + t * o1_t + h[:, None] * o1_h + d[None, :], mask=mask, other=0.0)
    y = tl.load(o2_ptr + t * o2_t + h[:, None] * o2_h + d[None, :], mask=mask, other=0.0)
    o = (x.to(tl.float32) * wa[:, None] + y.to(tl.float32) * wb[:, None]) / (wa + wb)[:, None]
    tl.store(out_ptr + t * out_t + h[:, None] * out_h + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=mask)


def merge_attention(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor,
                    out: torch.Tensor) -> None:
    """out [n, Hq, D] = attention over the union of two key sets, from each set's normalised
    attention o1, o2 ([1, Hq, n, D]) and log-sum-exp lse1, lse2 ([1, Hq, n] float32)."""
    n, heads, head_dim = out.shape
    for x in (o1, o2, out):
        if x.stride(-1) != 1:
            raise ValueError("merge_attention needs a unit stride along head_dim")
    _merge_kernel[(n,)](
        o1, lse1, o2, lse2, out,
        o1.stride(2), o1.stride(1), lse1.stride(2), lse1.stride(1),
        o2.stride(2), o2.stride(1), lse2.stride(2), lse2.stride(1), out.stride(0), out.stride(1),
        HEADS=heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(heads),
        BLOCK_D=triton.next_power_of_2(head_dim))
