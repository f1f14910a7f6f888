"""The sampler's batched operations on logits ([B, V] float32), one function each.

Each works on all rows of a step at once (rows that do not use a feature carry its neutral
value, or are named by an index tensor), so a step costs the same few kernels whatever its mix
of requests.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from hifc.layers import triton_argmax
from hifc.layers.triton_bitmask import triton_apply_token_bitmask
from hifc.layers.triton_jit import triton
from hifc.layers.triton_penalties import triton_apply_penalties

_MASK32 = 0xFFFFFFFF
_NEG_INF = float("-inf")


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first largest logit (int64 [B]); on CUDA two short Triton launches
    (``triton_argmax``) rather than torch's one slow reduction."""
    if triton_argmax.usable(logits):
        return triton_argmax.argmax_rows(logits)
    return logits.argmax(dim=-1)


def apply_penalties(logits: torch.Tensor, rows: torch.Tensor | None, pool_rows: torch.Tensor,
                    counts: torch.Tensor, seen: torch.Tensor, presence: torch.Tensor,
                    frequency: torch.Tensor, repetition: torch.Tensor) -> None:
    """vLLM's penalties, in place on ``logits[rows]`` (rows [R] long; None: every row).

    Request r's state is row ``pool_rows[r]`` of counts [N, V] float32 (times each token was
    generated) and seen [N, V] bool (token is in the prompt or the output); presence,
    frequency, repetition [R] float32. The repetition penalty divides positive and multiplies
    negative logits of seen tokens; then the frequency penalty subtracts count * penalty and
    the presence penalty subtracts the penalty from every generated token. On CUDA one Triton
    pass (``triton_penalties``) does it all.
    """
    if logits.is_cuda and triton is not None:
        triton_apply_penalties(logits, rows, pool_rows, counts, seen, presence, frequency,
                               repetition)
        return
    counts = counts.index_select(0, pool_rows)  # [R, V]
    seen = seen.index_select(0, pool_rows)
    sub = logits if rows is None else logits.index_select(0, rows)  # [R, V]
    rep = torch.where(seen, repetition[:, None], 1.0)
    sub = torch.where(sub > 0, sub / rep, sub * rep)
    sub.addcmul_(counts, frequency[:, None], value=-1.0)
    sub.addcmul_((counts > 0).to(sub.dtype), presence[:, None], value=-1.0)
    if rows is None:
        logits.copy_(sub)
    else:
        logits.index_copy_(0, rows, sub)


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Forbid, in ``logits[rows]``, the tokens whose bit is 0 in ``bitmask`` ([G, ceil(V/32)]
    int32; bit j of word w is token 32 w + j, the layout of xgrammar's token bitmasks). On CUDA
    one Triton pass (``triton_bitmask``)."""
    if logits.is_cuda and triton is not None:
        triton_apply_token_bitmask(logits, rows, bitmask)
        return
    vocab = logits.shape[-1]
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [G, W, 32]
    allowed = bits.view(bitmask.shape[0], -1)[:, :vocab].bool()  # [G, V]
    sub = logits.index_select(0, rows).masked_fill_(~allowed, _NEG_INF)
    logits.index_copy_(0, rows, sub)


def keep_only(logits: torch.Tensor, rows: torch.Tensor, entry_rows: torch.Tensor,
              entry_tokens: torch.Tensor) -> None:
    """Forbid every token of ``logits[rows]`` except the listed ones: entry i allows token
    ``entry_tokens[i]`` in row ``rows[entry_rows[i]]`` (entry_rows index into rows)."""
    keep = torch.zeros(rows.shape[0], logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep.view(-1).index_fill_(0, entry_rows * keep.shape[1] + entry_tokens, True)  # [A, V]
    sub = logits.index_select(0, rows).masked_fill_(~keep, _NEG_INF)
    logits.index_copy_(0, rows, sub)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Forbid tokens less likely than ``min_p`` ([B]) times the most likely token, in place."""
    probs = torch.softmax(logits, dim=-1)  # [B, V]
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    logits.masked_fill_(probs < threshold, _NEG_INF)


def apply_min_p_to_probs(probs: torch.Tensor, min_p: torch.Tensor) -> None:
    """:func:`apply_min_p` on probabilities [B, V] (zeroed, not renormalized: the draws of
    :func:`sample_inverse_cdf` scale with the total)."""
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    probs.masked_fill_(probs < threshold, 0.0)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask logits [B, V] outside each row's top-k ([B] long, V = off) and top-p ([B], 1.0 =
    off) sets with -inf; the most likely token is always kept."""
    vocab = logits.shape[-1]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    mask = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        mask |= ranks >= top_k[:, None]
    if top_p is not None:
        probs = torch.softmax(sorted_logits.masked_fill(mask, _NEG_INF), dim=-1)
        cum_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        mask |= cum_before >= top_p[:, None]
    mask[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(mask, _NEG_INF)
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def _mul32(x: np.ndarray, c: int) -> np.ndarray:
    """(x * c) mod 2**32 for uint64 x (the product wraps mod 2**64, which keeps its low 32
    bits)."""
    return (x * np.uint64(c)) & np.uint64(_MASK32)


def hash32(x: np.ndarray) -> np.ndarray:
    """A 32-bit avalanche hash (xor-shift-multiply) of uint64 values in [0, 2**32)."""
    x = x ^ (x >> np.uint64(16))
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> np.uint64(15))
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> np.uint64(16))


def seeded_uniform(seeds, steps) -> np.ndarray:
    """Uniform numbers [S] float32 in (0, 1) that depend only on (seed, step): a seeded
    request's draw never depends on the other rows of its batch or on the device. Computed on
    the host (a few vectorized integer operations, where the device would need some thirty
    kernel launches), then sent with the step's other inputs.
    seeds: S ints in [0, 2**63); steps: S ints (tokens generated so far)."""
    seeds = np.asarray(seeds, dtype=np.uint64)
    steps = np.asarray(steps, dtype=np.uint64)
    mask = np.uint64(_MASK32)
    hi, lo = seeds >> np.uint64(32), seeds & mask
    key = hash32(hash32(hi ^ np.uint64(0x9E3779B9)) ^ lo)  # the constants keep (0, 0) off 0
    bits = hash32(hash32(key ^ _mul32(steps & mask, 0x85EBCA6B)) ^ np.uint64(0x27D4EB2F))
    return ((bits >> np.uint64(8)).astype(np.float32) + np.float32(0.5)) \
        * np.float32(1.0 / (1 << 24))


CDF_CHUNK = 1024  # tokens per chunk of the two-level inverse CDF


def sample_inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor,
                       chunk: int = CDF_CHUNK) -> torch.Tensor:
    """One draw per row from probs [B, V] (not necessarily normalized) given uniform [B] in
    (0, 1): the first token whose cumulative probability exceeds uniform * total. A token of
    probability 0 is never drawn.

    Two levels, so that no scan runs over the whole vocabulary (a [64, 128k] cumsum took
    ~0.2 ms on the H200, most of a step's sampling): the chunks' sums and their cumulative sum
    pick the chunk, then one chunk of ``chunk`` tokens per row is scanned."""
    rows, vocab = probs.shape
    pad = -vocab % chunk
    blocks = F.pad(probs, (0, pad)).view(rows, -1, chunk) if pad else \
        probs.view(rows, -1, chunk)  # [B, C, chunk]
    block_cdf = blocks.sum(dim=-1).cumsum(dim=-1)  # [B, C]
    target = uniform[:, None] * block_cdf[:, -1:]  # [B, 1]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=blocks.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp_(min=0)), 0.0)
    inner = blocks.gather(1, block[:, :, None].expand(rows, 1, chunk)).squeeze(1)  # [B, chunk]
    inner_cdf = inner.cumsum(dim=-1) + before  # [B, chunk]
    index = torch.searchsorted(inner_cdf, target, right=True)  # [B, 1]
    # rounding can leave the target at or past the chunk's last sum: take its last token that
    # has probability
    positions = torch.arange(chunk, device=probs.device)
    last_nonzero = torch.where(inner > 0, positions, 0).amax(dim=-1, keepdim=True)
    return (block * chunk + torch.minimum(index, last_nonzero)).squeeze(1)


def top_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For log-probabilities [N, V] and chosen tokens [N]: the chosen tokens' logprobs [N] and
    ranks [N] (1 = most likely; ties share the better rank), and the top k ids and logprobs
    [N, k]."""
    chosen_lp = logprobs.gather(1, chosen[:, None]).squeeze(1)  # [N]
    ranks = (logprobs > chosen_lp[:, None]).sum(dim=-1) + 1  # [N]
    top_lp, top_ids = logprobs.topk(k, dim=-1)  # [N, k] each
    return chosen_lp, ranks, top_ids, top_lp
