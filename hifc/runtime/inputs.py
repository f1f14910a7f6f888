"""Builds each input tensor of a step from the scheduler's work list, one function each.

Host values reach a CUDA device through pinned memory without blocking (``to_device``): the host
can prepare step N+1 while the device still runs step N (asynchronous scheduling).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from hifc.core.scheduler import PENDING_TOKEN, ScheduledSeq
from hifc.layers.attention import AttentionMetadata, KeptRows, kept_rows


def to_device(values, dtype: torch.dtype, device) -> torch.Tensor:
    """A tensor of host ``values`` on ``device``. On CUDA the copy goes through pinned memory
    without blocking the host (a plain copy from pageable memory waits for the device's queue);
    torch's pinned allocator keeps the staging buffer until the copy has run."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda" or not host.numel():
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def build_input_ids(work: list[ScheduledSeq], device) -> torch.Tensor:
    """Token ids (``PENDING_TOKEN`` where the runner fills them in on the device)."""
    ids = [t for w in work for t in w.token_ids]
    return to_device(ids, torch.long, device)  # [T]


@dataclass(frozen=True)
class PendingInputs:
    """A step's pending tokens: where they go (``index`` among its flattened tokens; in a
    decode-only step, the row), and their rows of the ids the previous step sampled
    (``sampled`` [S] long, on the device)."""

    index: list[int]
    rows: list[int]
    sampled: torch.Tensor

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(index [P] long, token ids [P] long), both on the sampled ids' device."""
        both = to_device(self.index + self.rows, torch.long, self.sampled.device)  # one copy
        n = len(self.index)
        return both[:n], self.sampled.index_select(0, both[n:])


def pending_token_sources(work: list[ScheduledSeq],
                          sampled_rows: dict[str, int]) -> tuple[list[int], list[int]]:
    """(index among the step's tokens, row in the previous step's sampled ids) of each
    ``PENDING_TOKEN`` of the step; ``sampled_rows``: the previous step's row of each sequence
    that sampled in it. A pending token is the last of its sequence's chunk (a decode's one)."""
    index, rows = [], []
    offset = 0
    for w in work:
        offset += len(w.token_ids)
        if w.token_ids[-1] == PENDING_TOKEN:
            row = sampled_rows.get(w.request_id)
            if row is None:
                raise RuntimeError(f"{w.request_id}'s pending token was not sampled by the "
                                   "previous step")
            index.append(offset - 1)
            rows.append(row)
    return index, rows


def build_positions(work: list[ScheduledSeq], device) -> torch.Tensor:
    pos = [p for w in work for p in range(w.start_pos, w.seq_len)]
    return to_device(pos, torch.long, device)  # [T]


def build_slot_mapping(work: list[ScheduledSeq], block_size: int, device) -> torch.Tensor:
    slots = [w.block_table[p // block_size] * block_size + p % block_size
             for w in work for p in range(w.start_pos, w.seq_len)]
    return to_device(slots, torch.long, device)  # [T]


def build_query_start_loc(work: list[ScheduledSeq]) -> list[int]:
    loc = [0]
    for w in work:
        loc.append(loc[-1] + len(w.token_ids))
    return loc  # [B+1]


def build_block_tables(work: list[ScheduledSeq], device) -> torch.Tensor:
    width = max(len(w.block_table) for w in work)
    rows = [w.block_table + [0] * (width - len(w.block_table)) for w in work]
    return to_device(rows, torch.int32, device)  # [B, max_blocks]


def _logits_rows(work: list[ScheduledSeq], query_start_loc: list[int]) -> list[int]:
    return [end - 1 for w, end in zip(work, query_start_loc[1:]) if w.samples]


def build_logits_indices(work: list[ScheduledSeq], query_start_loc: list[int],
                         device) -> torch.Tensor:
    return to_device(_logits_rows(work, query_start_loc), torch.long,
                     device)  # [S]: last new token of each sampler


def build_kept_rows(work: list[ScheduledSeq], meta: AttentionMetadata, device) -> KeptRows:
    """The rows whose outputs the step needs (``build_logits_indices``'s) as the last layer
    attends them."""
    return kept_rows(meta, _logits_rows(work, meta.query_start_loc_cpu),
                     tensor=partial(to_device, device=device))


def build_attention_metadata(work: list[ScheduledSeq], block_size: int,
                             device) -> AttentionMetadata:
    qsl = build_query_start_loc(work)
    seq_lens = [w.seq_len for w in work]
    return AttentionMetadata(
        slot_mapping=build_slot_mapping(work, block_size, device),
        query_start_loc=to_device(qsl, torch.int32, device),
        seq_lens=to_device(seq_lens, torch.int32, device),
        block_tables=build_block_tables(work, device),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
        max_query_len=max(len(w.token_ids) for w in work),
        max_seq_len=max(seq_lens),
        block_size=block_size,
    )


# ---- decode batches in persistent buffers (CUDA graphs) ---------------------------------------
PAD_SLOT = -1  # slot of a padding token: the KV write skips it


@dataclass(frozen=True)
class DecodeInputLayout:
    """Where each input of a decode-only step sits in one packed int32 buffer.

    The buffer holds, for up to ``max_batch`` sequences of up to ``max_blocks`` blocks each:
    ``input_ids [M] | positions [M] | slot_mapping [M] | seq_lens [M] | query_start_loc [M+1] |
    block_tables [M, max_blocks]`` (M = max_batch). The offsets never change, so a CUDA graph
    captured over views of the device copy reads every later step's inputs; a batch of b rows
    lives in the first ``prefix_len(b)`` elements (one host-to-device copy).
    """

    max_batch: int
    max_blocks: int

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_blocks < 1:
            raise ValueError("max_batch and max_blocks must be positive")

    @property
    def block_tables_offset(self) -> int:
        return 5 * self.max_batch + 1

    @property
    def numel(self) -> int:
        return self.prefix_len(self.max_batch)

    def prefix_len(self, batch: int) -> int:
        """Elements a batch of ``batch`` rows occupies from the start of the buffer."""
        return self.block_tables_offset + batch * self.max_blocks

    def load_fields(self, batch: int) -> dict[str, int]:
        """Where a batch of ``batch`` rows keeps what ``triton_host_io.load_packed`` copies:
        the fields before the block tables, its input ids, its sequence lengths, its table
        rows."""
        return dict(header_len=self.block_tables_offset, ids_len=batch,
                    seq_lens_at=3 * self.max_batch, num_rows=batch, max_blocks=self.max_blocks)


@dataclass(frozen=True)
class DecodeInputs:
    """Views ([b] / [b+1] / [b, max_blocks], int32) of a packed decode buffer."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    block_tables: torch.Tensor


def decode_input_views(buffer: torch.Tensor, layout: DecodeInputLayout,
                       batch: int) -> DecodeInputs:
    """Views of the first ``batch`` rows of each input in ``buffer`` ([layout.numel] int32)."""
    if not 1 <= batch <= layout.max_batch:
        raise ValueError(f"batch {batch} is outside 1..{layout.max_batch}")
    m, bt = layout.max_batch, layout.block_tables_offset
    return DecodeInputs(
        input_ids=buffer[0:batch],
        positions=buffer[m:m + batch],
        slot_mapping=buffer[2 * m:2 * m + batch],
        seq_lens=buffer[3 * m:3 * m + batch],
        query_start_loc=buffer[4 * m:4 * m + batch + 1],
        block_tables=buffer[bt:bt + batch * layout.max_blocks].view(batch, layout.max_blocks),
    )


class TableRows:
    """Which block table each row of a packed buffer's block tables holds, so that a step
    writes only the entries appended since the last step wrote the same table into the same
    row: a table object only grows (``ScheduledSeq.block_table``), so the entries written
    before still hold. A decode step of 64 rows at 8,192 tokens packs in 0.03 ms so, against
    0.55 ms writing whole rows (2-core CPU machine, docs/RESULTS.md)."""

    def __init__(self, num_rows: int):
        self._tables: list[list[int] | None] = [None] * num_rows
        self._written = [0] * num_rows

    def write(self, tables: np.ndarray, row: int, table: list[int]) -> None:
        """Bring ``tables[row]``'s first ``len(table)`` entries to ``table``."""
        n = len(table)
        if self._tables[row] is table:
            start = self._written[row]
            if start < n:
                tables[row, start:n] = table[start:]
        else:
            tables[row, :n] = table
            self._tables[row] = table
        self._written[row] = n

    def forget(self, start: int, end: int) -> None:
        """Rows ``start..end-1`` were written otherwise (padding)."""
        for row in range(start, end):
            self._tables[row] = None


def fits_decode_layout(work: list[ScheduledSeq], layout: DecodeInputLayout) -> bool:
    """True for a decode-only step (one new token per sequence) that the layout holds."""
    return (0 < len(work) <= layout.max_batch
            and all(len(w.token_ids) == 1 and len(w.block_table) <= layout.max_blocks
                    for w in work))


def fill_decode_inputs(work: list[ScheduledSeq], batch: int, block_size: int,
                       layout: DecodeInputLayout, buffer: np.ndarray) -> list[int]:
    """Write a decode-only step, padded to ``batch`` rows, into ``buffer`` ([layout.numel]
    int32, host memory). Returns the real sequences' lengths. An empty ``work`` writes a batch
    of padding only.

    Padding rows are harmless: token 0 at position 0, slot PAD_SLOT (their K/V is not written),
    a context of one key in block 0 (finite, never garbage memory), one query each (so
    query_start_loc stays 0..batch). Only the first ``len(block_table)`` entries of a real row's
    block table are written: attention reads no further than its sequence length.
    """
    n = len(work)
    if not (n <= batch <= layout.max_batch and (n == 0 or fits_decode_layout(work, layout))):
        raise ValueError(f"{n} sequences do not fit a padded decode batch of {batch} rows "
                         f"(at most {layout.max_batch} rows of {layout.max_blocks} blocks, "
                         "one new token each)")
    return write_decode_inputs(work, batch, block_size, layout, buffer)


def write_decode_inputs(work: list[ScheduledSeq], batch: int, block_size: int,
                        layout: DecodeInputLayout, buffer: np.ndarray,
                        rows: TableRows | None = None) -> list[int]:
    """:func:`fill_decode_inputs` for a step already known to fit (the decode hot path, whose
    batch size came from :func:`fits_decode_layout`): the same writes, without checking.
    ``rows``: what the buffer's block table rows hold (only what changed is written)."""
    n = len(work)
    m, pad = layout.max_batch, batch - n
    positions = [w.start_pos for w in work]
    seq_lens = [p + 1 for p in positions]
    slots = [w.block_table[p // block_size] * block_size + p % block_size
             for w, p in zip(work, positions)]
    buffer[0:batch] = [w.token_ids[0] for w in work] + [0] * pad
    buffer[m:m + batch] = positions + [0] * pad
    buffer[2 * m:2 * m + batch] = slots + [PAD_SLOT] * pad
    buffer[3 * m:3 * m + batch] = seq_lens + [1] * pad
    buffer[4 * m:4 * m + batch + 1] = np.arange(batch + 1, dtype=np.int32)
    bt = layout.block_tables_offset
    tables = buffer[bt:bt + batch * layout.max_blocks].reshape(batch, layout.max_blocks)
    if rows is None:  # a buffer of its own: every row written whole
        rows = TableRows(batch)
    for row, w in enumerate(work):
        rows.write(tables, row, w.block_table)
    tables[n:, 0] = 0
    rows.forget(n, batch)
    return seq_lens


# ---- decodes plus one prompt chunk in persistent buffers (CUDA graphs) -------------------------
@dataclass(frozen=True)
class ChunkInputLayout:
    """Where each input of a step of decodes plus one prompt chunk sits in one packed int32
    buffer.

    A graph of ``b`` decode rows runs b + chunk + 1 tokens in b + 2 sequences: the decodes
    (padded to b rows as in :class:`DecodeInputLayout`), the chunk's c <= chunk tokens, and a
    padding sequence of the chunk + 1 - c tokens left (at least one). The buffer holds, with
    T = max_batch + chunk + 1 and R = max_batch + 2: ``input_ids [T] | positions [T] |
    slot_mapping [T] | seq_lens [R] | query_start_loc [R+1] | logits_index [max_batch+1] |
    block_tables [R, max_blocks]``; a graph of b rows reads the first b + chunk + 1 tokens and
    b + 2 sequences of each, and ``logits_index``'s first b + 1 entries (the decodes' tokens,
    then the chunk's last).
    """

    max_batch: int
    max_blocks: int
    chunk: int

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_blocks < 1 or self.chunk < 2:
            raise ValueError("max_batch and max_blocks must be positive and chunk at least 2")

    @property
    def max_tokens(self) -> int:
        return self.max_batch + self.chunk + 1

    @property
    def max_rows(self) -> int:
        return self.max_batch + 2

    @property
    def block_tables_offset(self) -> int:
        return 3 * self.max_tokens + 2 * self.max_rows + 1 + self.max_batch + 1

    @property
    def numel(self) -> int:
        return self.prefix_len(self.max_batch)

    def prefix_len(self, batch: int) -> int:
        """Elements a graph of ``batch`` decode rows reads from the start of the buffer."""
        return self.block_tables_offset + (batch + 2) * self.max_blocks

    def load_fields(self, batch: int) -> dict[str, int]:
        """As :meth:`DecodeInputLayout.load_fields`: a graph of ``batch`` decode rows reads
        batch + chunk + 1 input ids and batch + 2 sequences."""
        return dict(header_len=self.block_tables_offset, ids_len=batch + self.chunk + 1,
                    seq_lens_at=3 * self.max_tokens, num_rows=batch + 2,
                    max_blocks=self.max_blocks)


@dataclass(frozen=True)
class ChunkInputs(DecodeInputs):
    """Views of a packed chunk buffer for ``batch`` decode rows (int32): tokens [b+chunk+1],
    sequences [b+2] (+1), block_tables [b+2, max_blocks], and logits_index [b+1]."""

    logits_index: torch.Tensor


def chunk_input_views(buffer: torch.Tensor, layout: ChunkInputLayout,
                      batch: int) -> ChunkInputs:
    if not 1 <= batch <= layout.max_batch:
        raise ValueError(f"batch {batch} is outside 1..{layout.max_batch}")
    t, r = layout.max_tokens, layout.max_rows
    tokens, rows = batch + layout.chunk + 1, batch + 2
    logits_at = 3 * t + 2 * r + 1
    bt = layout.block_tables_offset
    return ChunkInputs(
        input_ids=buffer[0:tokens],
        positions=buffer[t:t + tokens],
        slot_mapping=buffer[2 * t:2 * t + tokens],
        seq_lens=buffer[3 * t:3 * t + rows],
        query_start_loc=buffer[3 * t + r:3 * t + r + rows + 1],
        logits_index=buffer[logits_at:logits_at + batch + 1],
        block_tables=buffer[bt:bt + rows * layout.max_blocks].view(rows, layout.max_blocks),
    )


def fits_chunk_layout(work: list[ScheduledSeq], layout: ChunkInputLayout) -> bool:
    """True for a step of decodes (one new token each, at least one) followed by one prompt
    chunk of 2..layout.chunk known tokens, that the layout holds."""
    if not 2 <= len(work) <= layout.max_batch + 1:
        return False
    chunk = work[-1]
    return (2 <= len(chunk.token_ids) <= layout.chunk
            and PENDING_TOKEN not in chunk.token_ids
            and all(len(w.block_table) <= layout.max_blocks for w in work)
            and all(len(w.token_ids) == 1 for w in work[:-1]))


def write_chunk_inputs(work: list[ScheduledSeq], batch: int, block_size: int,
                       layout: ChunkInputLayout, buffer: np.ndarray,
                       rows: TableRows | None = None) -> list[int]:
    """Write a step that ``fits_chunk_layout`` (decodes, then the chunk) with its decodes padded
    to ``batch`` rows into ``buffer`` ([layout.numel] int32, host memory); an empty ``work``
    writes padding only (a one-token chunk at position 0). Returns the sequence lengths of the
    step's b + 2 sequences, as the attention metadata's host side lists them.

    Padding decode rows are those of :func:`write_decode_inputs`. The padding sequence after
    the chunk holds its remaining tokens: token 0 at positions 0.., slot PAD_SLOT, its keys in
    block 0 (finite, never garbage memory); its logits are never read. ``rows``: as for
    :func:`write_decode_inputs`.
    """
    decodes, chunk = (work[:-1], work[-1]) if work else ([], None)
    n = len(decodes)
    t, r, pad = layout.max_tokens, layout.max_rows, batch - n
    chunk_ids = chunk.token_ids if chunk else [0]
    start = chunk.start_pos if chunk else 0
    table = chunk.block_table if chunk else [0]
    c = len(chunk_ids)
    tail = layout.chunk + 1 - c
    tokens = batch + layout.chunk + 1
    positions = [w.start_pos for w in decodes]
    chunk_pos = list(range(start, start + c))
    decode_slots = [w.block_table[p // block_size] * block_size + p % block_size
                    for w, p in zip(decodes, positions)]
    chunk_slots = ([table[p // block_size] * block_size + p % block_size for p in chunk_pos]
                   if chunk else [PAD_SLOT])
    seq_lens = [p + 1 for p in positions] + [1] * pad + [start + c, tail]
    buffer[0:tokens] = [w.token_ids[0] for w in decodes] + [0] * pad + chunk_ids + [0] * tail
    buffer[t:t + tokens] = positions + [0] * pad + chunk_pos + list(range(tail))
    buffer[2 * t:2 * t + tokens] = (decode_slots + [PAD_SLOT] * pad + chunk_slots
                                    + [PAD_SLOT] * tail)
    buffer[3 * t:3 * t + batch + 2] = seq_lens
    buffer[3 * t + r:3 * t + r + batch + 3] = list(range(batch + 1)) + [batch + c, tokens]
    logits_at = 3 * t + 2 * r + 1
    buffer[logits_at:logits_at + batch + 1] = (list(range(n)) + [batch + c - 1]
                                               + [0] * pad)
    bt = layout.block_tables_offset
    tables = buffer[bt:bt + (batch + 2) * layout.max_blocks].reshape(batch + 2, layout.max_blocks)
    if rows is None:  # a buffer of its own: every row written whole
        rows = TableRows(batch + 2)
    for row, w in enumerate(decodes):
        rows.write(tables, row, w.block_table)
    tables[n:batch, 0] = 0
    rows.forget(n, batch)
    rows.write(tables, batch, table)
    tables[batch + 1, :-(-tail // block_size)] = 0
    rows.forget(batch + 1, batch + 2)
    return seq_lens
