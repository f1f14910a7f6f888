"""The torch reference attention: its batched rows of one new token against attending each
sequence alone."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch
import torch.nn.functional as F

from hifc.layers import attention
from hifc.layers.attention import (FP8, AttentionMetadata, Rope, TorchAttentionBackend, kept_rows,
                                   quantize_kv, reference_paged_attention, step_rows)
from hifc.layers.rotary import RotaryEmbedding

BLOCK = 4
# (new tokens, cached tokens) per sequence, out of length order: decodes of several lengths,
# a one-token prompt chunk after a cached prefix, a fresh prompt and a later chunk
ROWS = [(1, 37), (5, 0), (1, 0), (1, 90), (1, 6), (7, 22), (1, 63), (1, 1)]


def step(num_q_heads: int, num_kv_heads: int, dtype: torch.dtype, seed: int):
    """q, a cache (float32, bfloat16 or float8) whose slots past every context hold NaN, its K/V
    scales (float8) and the step's metadata (shuffled blocks; table padding points at unused
    blocks)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    seq_lens = [new + cached for new, cached in ROWS]
    counts = [-(-n // BLOCK) for n in seq_lens]
    num_blocks = sum(counts) + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(n)] for n in counts]
    width = max(counts) + 2
    cache = torch.full((2, num_blocks, BLOCK, num_kv_heads, 16), float("nan"))
    for table, n in zip(tables, seq_lens):
        for p in range(n):
            cache[:, table[p // BLOCK], p % BLOCK] = torch.randn(2, num_kv_heads, 16,
                                                                 generator=gen)
    scales = None
    if dtype == torch.bfloat16:
        cache = cache.to(dtype)
    elif dtype == FP8:
        scales = torch.rand(2, num_kv_heads, generator=gen) + 0.5
        cache = torch.stack([quantize_kv(cache[i].view(-1, num_kv_heads, 16), scales[i])
                             .view(cache.shape[1:]) for i in (0, 1)])
    qsl = [0]
    for new, _ in ROWS:
        qsl.append(qsl[-1] + new)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(qsl[-1], dtype=torch.int64),  # unused: nothing is written
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [free[0]] * (width - len(t)) for t in tables],
                                  dtype=torch.int32),
        query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens, max_query_len=max(n for n, _ in ROWS),
        max_seq_len=max(seq_lens), block_size=BLOCK)
    q = torch.randn(qsl[-1], num_q_heads, 16, generator=gen) * 2
    return q, cache, scales, meta


def written_step(heads, dtype, seed):
    """``step`` with each new token's slot in its sequence's blocks (its K/V to write)."""
    q, cache, scales, meta = step(*heads, dtype, seed=seed)
    meta.slot_mapping = torch.tensor(
        [int(meta.block_tables[i, p // BLOCK]) * BLOCK + p % BLOCK
         for i, (new, cached) in enumerate(ROWS) for p in range(cached, cached + new)])
    return q, cache, scales, meta


def one_at_a_time(q, cache, meta, scale, window, softcap, scales):
    """Every sequence attended alone, through _attend_sequence."""
    out = torch.empty_like(q)
    for i in range(meta.num_seqs):
        attention._attend_sequence(q, cache, meta, i, out, scale, window, softcap, scales)
    return out


@pytest.mark.parametrize("heads", [(4, 1), (6, 2), (3, 3)])
@pytest.mark.parametrize("window,softcap", [(None, None), (9, None), (None, 1.5), (30, 2.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8], ids=str)
def test_single_query_rows_match_attending_each_sequence(heads, window, softcap, dtype):
    q, cache, scales, meta = step(*heads, dtype, seed=sum(heads))
    rows = step_rows(meta, heads[1] * 16)
    assert rows.multi == [1, 5] and len(rows.groups) == 1
    got = reference_paged_attention(q, cache, meta, 0.25, window, softcap, scales)
    assert torch.isfinite(got).all()  # NaN past every context is never read
    torch.testing.assert_close(got, one_at_a_time(q, cache, meta, 0.25, window, softcap, scales),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("floats,pad,spans,workspace", [
    # 64 positions of 32 floats (2 KV heads of 16) per group: the row of 91 takes two groups'
    # floats
    (64 * 32, attention.SINGLE_QUERY_PAD, [[91], [64], [38], [7, 2, 1]], 2 * 64 * 32),
    # at most 30 positions of padding per row (91 // 4 = 22 < 30)
    (attention.SINGLE_QUERY_GROUP_FLOATS, 30, [[91, 64], [38], [7, 2, 1]], 2 * 91 * 32),
])
def test_groups_split_by_gathered_size_and_padding(monkeypatch, floats, pad, spans, workspace):
    q, cache, _, meta = step(4, 2, torch.float32, seed=5)
    whole = reference_paged_attention(q, cache, meta, 0.25, 9)
    monkeypatch.setattr(attention, "SINGLE_QUERY_GROUP_FLOATS", floats)
    monkeypatch.setattr(attention, "SINGLE_QUERY_PAD", pad)
    rows = step_rows(meta, 32)  # contexts 91, 64, 38, 7, 2 and 1
    assert [[int(x) + 1 for x in g.last] for g in rows.groups] == spans
    assert [g.positions.shape[1] for g in rows.groups] == [s[0] for s in spans]  # padded
    assert rows.workspace.shape == (2, workspace)
    torch.testing.assert_close(reference_paged_attention(q, cache, meta, 0.25, 9, rows=rows),
                               whole, rtol=1e-5, atol=1e-5)


def test_workspace_past_the_group_budget_grows_in_multiples_and_shrinks(monkeypatch):
    q, cache, _, meta = step(4, 2, torch.float32, seed=5)
    monkeypatch.setattr(attention, "SINGLE_QUERY_GROUP_FLOATS", 40 * 32)
    long = step_rows(meta, 32)  # the row of 91 positions: 3 budgets of 40
    assert long.workspace.shape == (2, 3 * 40 * 32)
    for kept in (1, 3):  # a step within those multiples keeps it
        monkeypatch.setattr(attention, "SINGLE_QUERY_GROUP_FLOATS", 40 * 32 * kept)
        assert step_rows(meta, 32, long.workspace).workspace is long.workspace
    monkeypatch.setattr(attention, "SINGLE_QUERY_GROUP_FLOATS", 100 * 32)  # 91 fits a budget
    short = step_rows(meta, 32, long.workspace)
    assert short.workspace.shape == (2, 91 * 32)  # a step of shorter rows drops the excess
    within = torch.empty(2, 100 * 32)  # more than the step needs, within the budget: kept
    assert step_rows(meta, 32, within).workspace is within


def test_backend_keeps_a_steps_groups_for_its_layers():
    q, cache, _, meta = written_step((4, 2), torch.float32, seed=6)
    backend = TorchAttentionBackend()
    k = torch.randn(q.shape[0], 2, 16)
    first = backend.forward(q, k, k, cache, meta, 0.25)
    kept = backend._rows
    second = backend.forward(q, k, k, cache.clone(), meta, 0.25)
    assert backend._rows is kept  # the same step: the same rows
    next_step = dataclasses.replace(meta)
    backend.forward(q, k, k, cache.clone(), next_step, 0.25)
    assert backend._rows[0] is next_step and backend._rows[2].workspace is kept[2].workspace
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, one_at_a_time(q, cache, meta, 0.25, None, None, None),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads", [(4, 1), (3, 3)])
def test_a_whole_prompt_through_the_causal_flag_matches_the_mask(heads):
    # row 1 is a whole prompt (no cached context): without a window it takes torch's causal
    # flag; a window wider than every context changes nothing but takes the explicit mask
    q, cache, _, meta = step(*heads, torch.float32, seed=7)
    flag = reference_paged_attention(q, cache, meta, 0.25)
    mask = reference_paged_attention(q, cache, meta, 0.25, sliding_window=1000)
    torch.testing.assert_close(flag, mask, rtol=1e-5, atol=1e-5)
    first = meta.query_start_loc_cpu[1]
    assert not torch.allclose(flag[first], flag[first + 1])  # each token sees its own prefix


@pytest.mark.parametrize("heads", [(4, 1), (6, 2), (3, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8], ids=str)
def test_a_chunk_after_cached_context_in_two_parts_matches_the_mask(monkeypatch, heads, dtype):
    # row 5 is a chunk of 7 tokens after 22 cached ones; a window wider than every context
    # changes nothing but takes the explicit mask
    q, cache, scales, meta = step(*heads, dtype, seed=8)
    mask = reference_paged_attention(q, cache, meta, 0.25, 1000, None, scales)
    split = []
    attend = attention._attend_after_context
    monkeypatch.setattr(attention, "_attend_after_context",
                        lambda q, k, v, cached, scale: split.append(cached)
                        or attend(q, k, v, cached, scale))
    reference_paged_attention(q, cache, meta, 0.25, None, None, scales)
    assert split == []  # 7 x 29 pairs: one masked call
    monkeypatch.setattr(attention, "SPLIT_CONTEXT_PAIRS", 7 * 29)
    got = reference_paged_attention(q, cache, meta, 0.25, None, None, scales)
    assert split == [22]
    torch.testing.assert_close(got, mask, rtol=1e-5, atol=1e-5)
    reference_paged_attention(q, cache, meta, 0.25, 9, None, scales)
    reference_paged_attention(q, cache, meta, 0.25, None, 1.5, scales)
    assert split == [22]  # a window or soft-capping keeps the mask


@pytest.mark.parametrize("heads", [(4, 1), (3, 3)])
@pytest.mark.parametrize("window,softcap", [(None, None), (9, None), (None, 1.5)])
def test_a_bfloat16_model_attends_in_bfloat16_on_the_cpu(monkeypatch, heads, window, softcap):
    # decodes in a group, a whole prompt and a later chunk (in two parts without a window);
    # soft-capping stays in float32
    q, cache, _, meta = step(*heads, torch.bfloat16, seed=11)
    q = q.bfloat16()
    monkeypatch.setattr(attention, "SPLIT_CONTEXT_PAIRS", 1)
    seen = []  # the query dtype of every call of torch's attention, and of the two-part path
    sdpa, parts = F.scaled_dot_product_attention, attention._attend_after_context
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda q, *a, **k: seen.append(q.dtype) or sdpa(q, *a, **k))
    monkeypatch.setattr(attention, "_attend_after_context",
                        lambda q, *a: seen.append(q.dtype) or parts(q, *a))
    got = reference_paged_attention(q, cache, meta, 0.25, window, softcap)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    if softcap is None:  # groups, the whole prompt, and the chunk in two parts or masked
        assert len(seen) == 3 and set(seen) == {torch.bfloat16}
    else:
        assert seen == []  # soft-capping: its own float32 path
    expected = reference_paged_attention(q.float(), cache.float(), meta, 0.25, window, softcap)
    torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)


# rows of the step: the last of the 5-token prompt and one inside it, a decode, the last of the
# 7-token chunk and one inside it (out of order, as a caller may list them)
KEPT = [5, 3, 0, 15, 10]


def test_kept_rows_attend_as_decodes_over_their_positions():
    _, _, _, meta = written_step((4, 2), torch.float32, seed=8)
    kept = kept_rows(meta, KEPT)
    assert kept.index.tolist() == KEPT
    # each row sees its position + 1 keys of its sequence (sequences 1, 1, 0, 5, 5)
    assert kept.meta.seq_lens_cpu == kept.meta.seq_lens.tolist() == [5, 3, 38, 29, 24]
    assert kept.meta.query_start_loc_cpu == kept.meta.query_start_loc.tolist() == [0, 1, 2, 3,
                                                                                    4, 5]
    assert torch.equal(kept.meta.block_tables, meta.block_tables[[1, 1, 0, 5, 5]])
    assert torch.equal(kept.meta.slot_mapping, meta.slot_mapping[KEPT])
    assert (kept.meta.max_query_len, kept.meta.max_seq_len, kept.meta.num_leading_decodes) == (
        1, 38, 5)
    none = kept_rows(meta, [])
    assert none.index.shape == (0,) and none.meta.num_seqs == 0
    with pytest.raises(IndexError, match="row 18 is not one of the step's 18 tokens"):
        kept_rows(meta, [18])


@pytest.mark.parametrize("window,softcap", [(None, None), (9, None), (None, 1.5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8], ids=str)
def test_kept_rows_alone_match_those_rows_of_the_whole_step(window, softcap, dtype):
    # forward_kept writes every row's K/V as forward does, bit for bit, and gives forward's
    # attention at the kept rows, RoPE applied to both.
    q, cache, scales, meta = written_step((6, 2), dtype, seed=9)
    model_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    q = q.to(model_dtype)
    k, v = torch.randn(2, q.shape[0], 2, 16).to(model_dtype).unbind(0)
    positions = torch.tensor([p for new, cached in ROWS for p in range(cached, cached + new)])
    rope = Rope(RotaryEmbedding(16, 128, 10000.0, None, model_dtype, torch.device("cpu")),
                positions)
    whole_cache = cache.clone()
    whole = TorchAttentionBackend().forward(q, k, v, whole_cache, meta, 0.25, window, softcap,
                                            scales, rope=rope)
    kept = kept_rows(meta, KEPT)
    got = TorchAttentionBackend().forward_kept(q, k, v, cache, meta, kept, 0.25, window, softcap,
                                               scales, rope=rope)
    assert torch.equal(cache.view(torch.uint8), whole_cache.view(torch.uint8))
    # a bfloat16 model's rows attended in other groupings: within a rounding of the output
    tol = 8e-3 if model_dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, whole[KEPT], rtol=tol, atol=tol)
