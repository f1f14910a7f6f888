"""Padded decode batches: capture sizes, bucketing, and the packed input buffer (CPU)."""
import argparse
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hifc.config import EngineConfig
from hifc.config import add_engine_args, engine_config_from_args
from hifc.core.scheduler import PENDING_TOKEN, ScheduledSeq
from hifc.layers.attention import TorchAttentionBackend
from hifc.layers.tensor_parallel import SINGLE
from hifc.runtime import inputs
from hifc.runtime.cuda_graphs import (DecodeGraphs, capture_sizes, graphs_unsupported_reason,
                                      padded_batch_size)
from hifc.runtime.inputs import (PAD_SLOT, DecodeInputLayout, decode_input_views,
                                 fill_decode_inputs, fits_decode_layout)
from hifc.sampling_params import SamplingParams
from tests.runtime.helpers import chunk_work, decode_work

BLOCK = 16


def test_capture_sizes_follow_vllm_and_cap_at_max_num_seqs():
    assert capture_sizes(256) == [1, 2, 4] + list(range(8, 257, 8))
    assert capture_sizes(1000) == capture_sizes(256)
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(1) == [1]
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_padded_batch_size_is_the_next_captured_size():
    sizes = capture_sizes(64)
    assert [padded_batch_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 63, 64)] == \
        [1, 2, 4, 8, 8, 16, 64, 64]
    assert padded_batch_size(65, sizes) is None


def _filled(work, batch, layout):
    host = np.zeros(layout.numel, dtype=np.int32)
    lens = fill_decode_inputs(work, batch, BLOCK, layout, host)
    return lens, decode_input_views(torch.from_numpy(host), layout, batch)


def test_real_rows_match_the_eager_inputs_and_padding_is_harmless():
    work = decode_work([1, 17, 40, 33], BLOCK, seed=1)
    layout = DecodeInputLayout(max_batch=8, max_blocks=4)
    lens, x = _filled(work, 8, layout)
    n = len(work)
    meta = inputs.build_attention_metadata(work, BLOCK, "cpu")
    assert lens == meta.seq_lens_cpu == [1, 17, 40, 33]
    assert x.input_ids[:n].tolist() == inputs.build_input_ids(work, "cpu").tolist()
    assert x.positions[:n].tolist() == inputs.build_positions(work, "cpu").tolist()
    assert x.slot_mapping[:n].tolist() == meta.slot_mapping.tolist()
    assert x.seq_lens[:n].tolist() == meta.seq_lens.tolist()
    for i, w in enumerate(work):
        assert x.block_tables[i, :len(w.block_table)].tolist() == w.block_table
    # padding rows: no KV write, one key in block 0, one query each
    assert x.slot_mapping[n:].tolist() == [PAD_SLOT] * 4
    assert x.seq_lens[n:].tolist() == [1] * 4
    assert x.input_ids[n:].tolist() == [0] * 4 and x.positions[n:].tolist() == [0] * 4
    assert x.block_tables[n:, 0].tolist() == [0] * 4
    assert x.query_start_loc.tolist() == list(range(9))
    assert x.block_tables.shape == (8, 4) and x.block_tables.stride(-1) == 1


def test_refilling_a_smaller_batch_overwrites_what_attention_reads():
    layout = DecodeInputLayout(max_batch=8, max_blocks=4)
    host = np.zeros(layout.numel, dtype=np.int32)
    fill_decode_inputs(decode_work([60, 61, 62, 63, 64, 49, 50], BLOCK, seed=2), 8, BLOCK,
                       layout, host)
    small = decode_work([5, 20], BLOCK, seed=3)
    fill_decode_inputs(small, 4, BLOCK, layout, host)
    x = decode_input_views(torch.from_numpy(host), layout, 4)
    assert x.seq_lens.tolist() == [5, 20, 1, 1]
    assert x.slot_mapping[2:].tolist() == [PAD_SLOT, PAD_SLOT]
    assert x.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    for i, w in enumerate(small):  # only the blocks each length reaches
        assert x.block_tables[i, :len(w.block_table)].tolist() == w.block_table
    assert x.block_tables[2:, 0].tolist() == [0, 0]


def test_one_copy_covers_the_batch():
    layout = DecodeInputLayout(max_batch=8, max_blocks=4)
    assert layout.numel == 5 * 8 + 1 + 8 * 4
    assert layout.prefix_len(2) == 5 * 8 + 1 + 2 * 4
    buf = torch.arange(layout.numel, dtype=torch.int32)
    x = decode_input_views(buf, layout, 2)
    used = torch.cat([x.input_ids, x.positions, x.slot_mapping, x.seq_lens,
                      x.query_start_loc, x.block_tables.flatten()])
    assert int(used.max()) < layout.prefix_len(2)
    with pytest.raises(ValueError):
        decode_input_views(buf, layout, 9)


def test_prefill_long_tables_and_oversized_batches_are_refused():
    layout = DecodeInputLayout(max_batch=4, max_blocks=2)
    ok = decode_work([3, 32], BLOCK)
    assert fits_decode_layout(ok, layout)
    prefill = [ok[0].__class__(ok[0].request_id, [5, 6], 0, [1], ok[0].sampling_params)]
    assert not fits_decode_layout(prefill, layout)
    assert not fits_decode_layout(decode_work([33], BLOCK), layout)  # 3 blocks > 2
    assert not fits_decode_layout(decode_work([1] * 5, BLOCK), layout)
    host = np.zeros(layout.numel, dtype=np.int32)
    with pytest.raises(ValueError, match="do not fit"):
        fill_decode_inputs(prefill, 4, BLOCK, layout, host)
    with pytest.raises(ValueError, match="do not fit"):
        fill_decode_inputs(ok, 1, BLOCK, layout, host)
    fill_decode_inputs([], 4, BLOCK, layout, host)  # padding only (capture)
    assert host[2 * 4:3 * 4].tolist() == [PAD_SLOT] * 4


def _stub_model(num_heads: int = 4) -> SimpleNamespace:
    """What DecodeGraphs reads of a model before any forward: its query heads and dtype."""
    return SimpleNamespace(arch=SimpleNamespace(num_attention_heads=num_heads), tp=SINGLE,
                           dtype=torch.bfloat16)


KV_CACHE = torch.zeros(2, 1, BLOCK, 2, 8)  # one layer: [K/V, blocks, block, KV heads, dim]


def test_decode_graphs_route_only_padded_decode_steps():
    graphs = DecodeGraphs(_stub_model(), [KV_CACHE], TorchAttentionBackend(), BLOCK,
                          max_model_len=64, batch_sizes=[1, 2, 4], device=torch.device("cpu"))
    assert graphs.layout == DecodeInputLayout(4, 4)
    assert graphs.decode_caps == {1: [64], 2: [64], 4: [64]}
    assert graphs.batch_size_for(decode_work([10, 20, 30], BLOCK)) == 4
    assert graphs.batch_size_for(decode_work([10] * 5, BLOCK)) is None
    assert graphs.batch_size_for(decode_work([65], BLOCK)) is None
    with pytest.raises(RuntimeError, match="CUDA"):
        graphs.capture()
    with pytest.raises(ValueError):
        DecodeGraphs(_stub_model(), [KV_CACHE], TorchAttentionBackend(), BLOCK, 64, [4, 2],
                     torch.device("cpu"))


def test_decode_graphs_tell_the_backend_their_batch_sizes_and_take_its_caps():
    # so that it plans other steps' decodes as the graphs' (TritonAttentionBackend); the
    # backend names each batch size's caps, the graphs keep them
    told = []

    class Recording(TorchAttentionBackend):
        def plan_decodes_as_graphs(self, batch_sizes, max_model_len, num_q_heads, kv_cache,
                                   dtype):
            told.append((list(batch_sizes), max_model_len, num_q_heads, kv_cache is KV_CACHE,
                         dtype))
            return {1: [16, 64], 2: [32, 64], 4: [64]}

    graphs = DecodeGraphs(_stub_model(6), [KV_CACHE], Recording(), BLOCK, max_model_len=64,
                          batch_sizes=[1, 2, 4], device=torch.device("cpu"))
    assert told == [([1, 2, 4], 64, 6, True, torch.bfloat16)]
    assert graphs.num_forwards == 5
    assert [graphs.context_cap_for(graphs.decode_caps[b], lens)
            for b, lens in [(1, [16]), (1, [17]), (2, [3, 32]), (2, [33, 1]), (4, [5])]] == \
        [16, 64, 32, 64, 64]


def test_graphs_need_cuda_and_a_backend_reading_device_lengths():
    cuda = torch.device("cuda")
    assert "not CUDA" in graphs_unsupported_reason(torch.device("cpu"), TorchAttentionBackend(), 10)
    assert "host-side" in graphs_unsupported_reason(cuda, TorchAttentionBackend(), 10)
    triton_attention = pytest.importorskip("hifc.layers.triton_attention")
    pytest.importorskip("triton")
    backend = triton_attention.TritonAttentionBackend()
    assert graphs_unsupported_reason(cuda, backend, 10) is None
    assert "int32" in graphs_unsupported_reason(cuda, backend, 2 ** 31)
    no_fused = triton_attention.TritonAttentionBackend(triton_kv_write=False)
    assert "padding" in graphs_unsupported_reason(cuda, no_fused, 10)


def test_enforce_eager_option_and_flag():
    assert EngineConfig().enforce_eager is False
    assert EngineConfig.from_options(enforce_eager=True).enforce_eager is True
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(enforce_eager="yes")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(["--enforce-eager"])).enforce_eager is True
    assert engine_config_from_args(parser.parse_args([])).enforce_eager is False


def test_pending_tokens_are_found_in_the_previous_steps_sampled_rows():
    work = [ScheduledSeq("a", [PENDING_TOKEN], 9, [0], SamplingParams()),
            ScheduledSeq("b", [5, 6, 7], 0, [1], SamplingParams()),
            ScheduledSeq("c", [PENDING_TOKEN], 20, [2, 3], SamplingParams())]
    assert inputs.pending_token_sources(work, {"c": 0, "a": 2, "x": 1}) == ([0, 4], [2, 0])
    with pytest.raises(RuntimeError, match="c's pending token was not sampled"):
        inputs.pending_token_sources(work, {"a": 0})


def _chunk_step(decode_lens, chunk_start, chunk_len, seed=0):
    return chunk_work(decode_lens, chunk_start, chunk_len, BLOCK, seed=seed)


def test_chunk_inputs_match_the_eager_inputs_and_pad_the_rest():
    work = _chunk_step([5, 40, 18], 30, 9, seed=2)
    layout = inputs.ChunkInputLayout(max_batch=8, max_blocks=4, chunk=12)
    host = np.zeros(layout.numel, dtype=np.int32)
    assert inputs.fits_chunk_layout(work, layout)
    lens = inputs.write_chunk_inputs(work, 4, BLOCK, layout, host)
    x = inputs.chunk_input_views(torch.from_numpy(host), layout, 4)
    meta = inputs.build_attention_metadata(work, BLOCK, "cpu")
    # three decodes, one padding decode row, the chunk, a padding sequence of 12 + 1 - 9 tokens
    assert lens == [5, 40, 18, 1, 39, 4]
    assert x.query_start_loc.tolist() == [0, 1, 2, 3, 4, 13, 17]
    decodes, chunk = slice(0, 3), slice(4, 13)
    eager_ids = inputs.build_input_ids(work, "cpu").tolist()
    assert x.input_ids[decodes].tolist() + x.input_ids[chunk].tolist() == eager_ids
    positions = inputs.build_positions(work, "cpu").tolist()
    assert x.positions[decodes].tolist() + x.positions[chunk].tolist() == positions
    slots = meta.slot_mapping.tolist()
    assert x.slot_mapping[decodes].tolist() + x.slot_mapping[chunk].tolist() == slots
    assert x.slot_mapping[3].item() == PAD_SLOT and x.slot_mapping[13:].tolist() == [PAD_SLOT] * 4
    assert x.positions[13:].tolist() == [0, 1, 2, 3]  # the padding sequence attends to block 0
    assert x.block_tables[4, :len(work[-1].block_table)].tolist() == work[-1].block_table
    assert x.block_tables[5, 0].item() == 0 and x.block_tables[3, 0].item() == 0
    # logits rows in work order: the decodes' tokens, then the chunk's last, then padding
    assert x.logits_index.tolist() == [0, 1, 2, 12, 0]


def test_chunk_layout_takes_decodes_then_one_short_known_chunk():
    layout = inputs.ChunkInputLayout(max_batch=4, max_blocks=4, chunk=8)
    assert inputs.fits_chunk_layout(_chunk_step([5, 9], 20, 8), layout)
    assert not inputs.fits_chunk_layout(_chunk_step([5, 9], 20, 9), layout)  # chunk too long
    assert not inputs.fits_chunk_layout(_chunk_step([], 20, 4), layout)  # no decode
    assert not inputs.fits_chunk_layout(_chunk_step([3] * 5, 20, 4), layout)  # 5 decode rows
    assert not inputs.fits_chunk_layout(decode_work([5, 9, 4], BLOCK), layout)  # decodes only
    two_chunks = _chunk_step([5], 20, 4)
    two_chunks.insert(0, two_chunks[-1])
    assert not inputs.fits_chunk_layout(two_chunks, layout)
    pending = _chunk_step([5], 20, 4)
    last = pending[-1]
    pending[-1] = ScheduledSeq(last.request_id, last.token_ids[:-1] + [PENDING_TOKEN],
                               last.start_pos, last.block_table, SamplingParams())
    assert not inputs.fits_chunk_layout(pending, layout)
    assert not inputs.fits_chunk_layout(_chunk_step([5], 70, 4), layout)  # 5 blocks


@pytest.mark.parametrize("kind", ["decode", "chunk"])
def test_rows_rewrite_only_what_grew_and_match_whole_writes(kind):
    """Steps through one persistent buffer with ``TableRows``: tables that grow in place, are
    replaced (a new object, as a swap or a readmission makes), change rows, or leave a row to
    padding; after every step the rows attention reads equal those a fresh buffer gets."""
    rng = np.random.default_rng(7)
    block = 4
    if kind == "decode":
        layout = DecodeInputLayout(max_batch=8, max_blocks=16)
        write, views = inputs.write_decode_inputs, inputs.decode_input_views
    else:
        layout = inputs.ChunkInputLayout(max_batch=8, max_blocks=16, chunk=6)
        write, views = inputs.write_chunk_inputs, inputs.chunk_input_views
    host = np.full(layout.numel, -7, dtype=np.int32)
    rows = inputs.TableRows((layout.numel - layout.block_tables_offset) // layout.max_blocks)
    tables = {i: [int(b) for b in rng.integers(0, 500, 2)] for i in range(10)}
    lens = {i: len(t) * block - 1 for i, t in tables.items()}
    partial = 0
    for step in range(60):
        for i in tables:
            lens[i] += 1
            if lens[i] > len(tables[i]) * block:
                tables[i].append(int(rng.integers(0, 500)))  # grows in place
            if len(tables[i]) > 14:  # finished: a new sequence in its place
                tables[i] = [int(rng.integers(0, 500))]
                lens[i] = 2
            elif rng.random() < 0.05:  # swapped and back: a new table object
                tables[i] = [int(rng.integers(0, 500)) for _ in tables[i]]
        ids = list(rng.permutation(10)[:int(rng.integers(1 + (kind == "chunk"), 8))])
        if step % 7 == 0:
            ids.sort()  # mostly the same rows as the step before
        work = [ScheduledSeq(f"r{i}", [1], lens[i] - 1, tables[i], SamplingParams()) for i in ids]
        if kind == "chunk":
            chunk_table = tables[ids[-1]]
            c = min(int(rng.integers(2, 7)), len(chunk_table) * block)
            start = max(0, min(lens[ids[-1]], len(chunk_table) * block) - c)
            work[-1] = ScheduledSeq("c", [5] * c, start, chunk_table, SamplingParams())
            batch = len(work) - 1 + int(rng.integers(0, 2))
        else:
            batch = len(work) + int(rng.integers(0, 2))
        write(work, batch, block, layout, host, rows)
        fresh = np.full(layout.numel, -7, dtype=np.int32)
        write(work, batch, block, layout, fresh)
        bt, width = layout.block_tables_offset, layout.max_blocks
        for row, w in enumerate(work[:-1] if kind == "chunk" else work):
            n = len(w.block_table)
            got = host[bt + row * width:bt + row * width + n]
            assert got.tolist() == fresh[bt + row * width:bt + row * width + n].tolist() \
                == w.block_table
        if kind == "chunk":
            at = bt + batch * width
            assert host[at:at + len(work[-1].block_table)].tolist() == work[-1].block_table
        got, want = (views(torch.from_numpy(a), layout, batch) for a in (host, fresh))
        for field in dataclasses.fields(got):
            if field.name != "block_tables":
                assert torch.equal(getattr(got, field.name), getattr(want, field.name))
        partial += any(rows._tables[r] is w.block_table for r, w in enumerate(work))
    assert partial > 10  # rows did carry over from step to step
