"""CUDA graphs of decode steps: one captured model forward + logits per batch size (and, with
``chunk_tokens``, per batch size of decodes beside one prompt chunk).

A decode-only step of n sequences is padded to the smallest captured size b >= n. Its inputs are
packed into one pinned host buffer (``hifc.runtime.inputs.write_decode_inputs``), loaded into
the device buffer the graphs were captured over by one kernel (``triton_host_io.load_packed``,
which reads the input ids the previous step sampled where they are, on the device, and of each
block table only what the sequence reaches), and graph b is replayed; the logits of the n real
rows go to the (eager, per-request seeded) sampler. Prefill and mixed steps, and
decode batches above the largest size, run eagerly, except, with ``chunk_tokens`` C: a step of
n decodes followed by one prompt chunk of 2..C known tokens (what the scheduler makes of a
long prompt under ``long_prefill_token_threshold``) replays a graph of b >= n decode rows plus
C + 1 chunk tokens (``hifc.runtime.inputs.ChunkInputLayout``: the chunk, then a padding
sequence of the tokens it leaves), whose logits are the decodes' and the chunk's last token's.
Such a step costs its device time only; run eagerly, its ~10 kernel launches per layer cost
the host more than the device (8B preset: ~20 ms per step against ~13 ms of kernels,
docs/RESULTS.md).

What makes a replay valid for any step:
- every tensor the graph reads lives at a fixed address: the packed device buffer, the KV cache
  (and a float8 cache's scales), the weights; the host-side fields of the captured
  ``AttentionMetadata`` are stale at replay, so only backends that read lengths from device
  memory may be captured (``TritonAttentionBackend`` does: its grid depends on the number of
  rows only, and it sizes split-KV segments from the device-side sequence lengths);
- the launch plan is fixed per graph: it is planned from a context cap (``max_seq_len``), not
  from the step's own lengths. The backend names each batch size's caps
  (``plan_decodes_as_graphs``; the Triton backend's: the longest context its batch plans as it
  plans a short one, under which no decode step splits its keys into balanced segments, and
  max_model_len), and the caps of the graphs with a prompt chunk (``graph_context_caps``: a
  short one and max_model_len); each batch size has a graph per cap, and a step replays the
  one of the smallest cap that holds its longest sequence;
- padding rows write no K/V (slot -1, skipped by the Triton KV write) and attend to one key of
  block 0, so they read only initialised memory; their logits are dropped.

Without capture (``capture=False``) the same padded forward runs eagerly each step: that is what
``enforce_eager`` runs on CUDA (a matrix kernel's rounding depends on the batch size it runs at,
so only the same padding gives bit-identical logits), and CPU tests use it to check the padding
and buffer logic against the unpadded path.
"""
from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Collection, Iterator
from functools import cached_property, partial

import torch

from hifc.core.scheduler import ScheduledSeq
from hifc.layers import triton_host_io
from hifc.layers.attention import AttentionBackend, AttentionContext, AttentionMetadata
from hifc.layers.triton_jit import meet_kernels
from hifc.runtime.inputs import (ChunkInputLayout, DecodeInputLayout, PendingInputs, TableRows,
                                 chunk_input_views, decode_input_views, fits_chunk_layout,
                                 fits_decode_layout, write_chunk_inputs, write_decode_inputs)

logger = logging.getLogger(__name__)

MAX_CAPTURE_SIZE = 256
# Chunk graphs hold at most this many chunk tokens: their steps stay short, and never take the
# dense-prefill path (hifc.layers.dense_attention.DENSE_PREFILL_MIN_TOKENS), which reads
# host-side lengths.
MAX_CHUNK_GRAPH_TOKENS = 256


def capture_sizes(max_num_seqs: int, limit: int = MAX_CAPTURE_SIZE) -> list[int]:
    """Batch sizes to capture (vLLM's): 1, 2, 4, then multiples of 8, up to min(max_num_seqs,
    limit), which is itself included."""
    cap = min(max_num_seqs, limit)
    if cap < 1:
        raise ValueError(f"max_num_seqs must be positive, got {max_num_seqs}")
    sizes = [s for s in [1, 2, 4, *range(8, cap + 1, 8)] if s <= cap]
    return sizes if sizes[-1] == cap else sizes + [cap]


def padded_batch_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest size in ``sizes`` (ascending) that holds num_seqs rows; None if none does."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


def chunk_graph_tokens(long_prefill_token_threshold: int, max_model_len: int) -> int:
    """The chunk size of the chunk graphs an engine captures: its long_prefill_token_threshold
    when that is at most MAX_CHUNK_GRAPH_TOKENS (and below max_model_len), else 0 (none)."""
    t = long_prefill_token_threshold
    return t if 2 <= t <= MAX_CHUNK_GRAPH_TOKENS and t < max_model_len else 0


def graphs_unsupported_reason(device: torch.device, backend: AttentionBackend,
                              num_slots: int) -> str | None:
    """Why decode steps on this device/backend cannot be captured; None if they can."""
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    from hifc.layers.triton_attention import TritonAttentionBackend
    if not isinstance(backend, TritonAttentionBackend):
        return f"attention backend {type(backend).__name__} reads host-side lengths"
    if not backend.triton_kv_write:
        return "the torch KV write cannot skip padding slots"
    if num_slots >= 2 ** 31:
        return f"{num_slots} KV slots do not fit the int32 input buffer"
    return None


class _InputBuffers:
    """The pinned host buffer a layout's steps are packed into, and the device buffer the
    graphs read (the same memory without CUDA), which starts as a batch of padding rows;
    ``write`` packs a step, ``views`` reads the device buffer as the forward's inputs."""

    def __init__(self, layout, write, views, block_size: int, device: torch.device):
        self.layout, self.write, self.views = layout, write, views
        pin = device.type == "cuda"
        self.host = torch.zeros(layout.numel, dtype=torch.int32, pin_memory=pin)
        self.host_array = self.host.numpy()  # the same memory, filled row by row
        self.rows = TableRows((layout.numel - layout.block_tables_offset) // layout.max_blocks)
        write([], layout.max_batch, block_size, layout, self.host_array, self.rows)
        self.device = self.host.to(device) if pin else self.host


class DecodeGraphs:
    """Padded decode steps over persistent input buffers, replayed from CUDA graphs."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor],
                 backend: AttentionBackend, block_size: int, max_model_len: int,
                 batch_sizes: list[int], device: torch.device,
                 kv_scales: list[torch.Tensor] | None = None, chunk_tokens: int = 0):
        if not batch_sizes or sorted(set(batch_sizes)) != list(batch_sizes) or batch_sizes[0] < 1:
            raise ValueError(f"batch_sizes must be ascending positive sizes, got {batch_sizes}")
        if chunk_tokens and not 2 <= chunk_tokens <= min(MAX_CHUNK_GRAPH_TOKENS,
                                                         max_model_len - 1):
            raise ValueError(f"chunk_tokens must be 0 or 2..{MAX_CHUNK_GRAPH_TOKENS} (and below "
                             f"max_model_len), got {chunk_tokens}")
        self.model = model
        self.kv_caches = kv_caches
        self.kv_scales = kv_scales  # per layer [2, Hkv] float32 for a float8 cache
        self.backend = backend
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.batch_sizes = list(batch_sizes)
        self.device = device
        self.layout = DecodeInputLayout(max(batch_sizes), -(-max_model_len // block_size))
        self._copied = (torch.cuda.Event() if device.type == "cuda"  # host buffers free again
                        else None)
        # the sampled ids a step without pending tokens loads with (it reads none)
        self._no_sampled = torch.zeros(1, dtype=torch.long, device=device)
        self.inputs = _InputBuffers(self.layout, write_decode_inputs, decode_input_views,
                                    block_size, device)
        self.chunk_layout = (ChunkInputLayout(max(batch_sizes), self.layout.max_blocks,
                                              chunk_tokens) if chunk_tokens else None)
        self.chunk_inputs = (_InputBuffers(self.chunk_layout, write_chunk_inputs,
                                           chunk_input_views, block_size, device)
                             if chunk_tokens else None)
        self.context_caps = backend.graph_context_caps(max_model_len)  # the chunk graphs'
        # batch size -> its decode graphs' caps
        self.decode_caps = backend.plan_decodes_as_graphs(
            self.batch_sizes, max_model_len, model.tp.split(model.arch.num_attention_heads),
            kv_caches[0], model.dtype)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (batch, cap) -> graph
        # (decode rows, cap) -> graph of those decodes beside one prompt chunk
        self.chunk_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # batch size -> its graphs' output [b (+1 with chunk graphs), V] logits (one buffer
        # for every cap, the decode graphs' in its first b rows)
        self._logits: dict[int, torch.Tensor] = {}
        self.last_replayed: tuple[int, int] | None = None  # the last decode graph replayed
        self.num_chunk_steps = 0  # steps run through the chunk path (replayed or not)
        self.capture_seconds = 0.0
        self.capture_bytes = 0  # device memory the graphs' pool holds after capture

    def batch_size_for_rows(self, num_rows: int) -> int | None:
        """The padded size a decode step of num_rows sequences runs at (None: eagerly)."""
        return padded_batch_size(num_rows, self.batch_sizes)

    def batch_size_for(self, work: list[ScheduledSeq]) -> int | None:
        """The padded size this step runs at, or None when it must run eagerly."""
        if not fits_decode_layout(work, self.layout):
            return None
        return self.batch_size_for_rows(len(work))

    @property
    def captured_sizes(self) -> list[int]:
        return sorted({batch for batch, _ in self.graphs})

    @staticmethod
    def context_cap_for(caps: list[int], seq_lens: list[int]) -> int:
        """The smallest of ``caps`` that holds every sequence of a step."""
        longest = max(seq_lens)
        return next(cap for cap in caps if cap >= longest)

    def _forward(self, batch: int, seq_lens_cpu: list[int], cap: int) -> torch.Tensor:
        """The padded forward over the device buffer's first ``batch`` rows, planned for
        contexts up to ``cap`` -> logits [b, V]."""
        x = decode_input_views(self.inputs.device, self.layout, batch)
        meta = AttentionMetadata(
            slot_mapping=x.slot_mapping.long(),
            query_start_loc=x.query_start_loc,
            seq_lens=x.seq_lens,
            block_tables=x.block_tables,
            query_start_loc_cpu=list(range(batch + 1)),
            seq_lens_cpu=seq_lens_cpu,
            max_query_len=1,
            max_seq_len=cap,  # fixes the launch plan for any step of this size and cap
            block_size=self.block_size,
        )
        ctx = AttentionContext(meta, self.kv_caches, self.backend, self.model.attention_layers,
                               self.kv_scales)
        hidden = self.model(x.input_ids.long(), x.positions.long(), ctx)  # [b, H]
        return self.model.compute_logits(hidden)  # [b, V]: one new token per row

    def _load(self, work: list[ScheduledSeq], batch: int,
              pending: PendingInputs | None = None, chunk: bool = False) -> list[int]:
        """Pack the step (sized by batch_size_for, or with ``chunk`` by chunk_batch_for, so
        known to fit) into its host buffer with the ``pending`` ids' places (their index among
        the step's tokens, which is their row in either layout) and queue its load into the
        device buffer, which reads those ids where the previous step sampled them, on the
        device (``triton_host_io.load_packed``: a kernel, no copy-engine transfer)."""
        buffers = self.chunk_inputs if chunk else self.inputs
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's load has read the host buffers
        seq_lens = buffers.write(work, batch, self.block_size, buffers.layout, buffers.host_array,
                                 buffers.rows)
        if self._copied is None:  # one buffer: put the pending ids in place
            if pending is not None:
                index, token_ids = pending.gather()
                input_ids = buffers.views(buffers.device, buffers.layout, batch).input_ids
                input_ids.index_copy_(0, index, token_ids.to(torch.int32))
            return seq_lens
        sampled = self._no_sampled
        if pending is not None:
            buffers.host_array[pending.index] = [-1 - row for row in pending.rows]
            sampled = pending.sampled
        triton_host_io.load_packed(buffers.host, buffers.device, sampled,
                                   block_size=self.block_size,
                                   **buffers.layout.load_fields(batch))
        self._copied.record()
        return seq_lens

    def chunk_batch_for(self, work: list[ScheduledSeq]) -> int | None:
        """The padded number of decode rows a step of decodes plus one prompt chunk runs at
        through the chunk graphs, or None when it cannot."""
        if self.chunk_layout is None or not fits_chunk_layout(work, self.chunk_layout):
            return None
        return self.batch_size_for_rows(len(work) - 1)

    def _forward_chunk(self, batch: int, seq_lens_cpu: list[int], cap: int) -> torch.Tensor:
        """The padded forward of ``batch`` decode rows and the chunk over the chunk buffer,
        planned for contexts up to ``cap`` -> logits [b + 1, V]: the decode rows', then the
        chunk's last token's (in the row after the step's real decodes)."""
        layout = self.chunk_layout
        x = chunk_input_views(self.chunk_inputs.device, layout, batch)
        chunk_len = layout.chunk + 1 - seq_lens_cpu[-1]  # the padding sequence takes the rest
        tokens = batch + layout.chunk + 1
        meta = AttentionMetadata(
            slot_mapping=x.slot_mapping.long(),
            query_start_loc=x.query_start_loc,
            seq_lens=x.seq_lens,
            block_tables=x.block_tables,
            query_start_loc_cpu=list(range(batch + 1)) + [batch + chunk_len, tokens],
            seq_lens_cpu=seq_lens_cpu,
            max_query_len=layout.chunk + 1,  # fixes the launch plan, as max_seq_len does
            max_seq_len=cap,
            block_size=self.block_size,
            num_leading_decodes=batch,  # attended apart from the chunk's rows
        )
        ctx = AttentionContext(meta, self.kv_caches, self.backend, self.model.attention_layers,
                               self.kv_scales)
        # [b + 1, H]: the last layer's output projection and MLP run on the sampled rows alone
        hidden = self.model(x.input_ids.long(), x.positions.long(), ctx, x.logits_index.long())
        return self.model.compute_logits(hidden)

    def _run_chunk(self, work: list[ScheduledSeq], batch: int,
                   pending: PendingInputs | None) -> torch.Tensor:
        self.num_chunk_steps += 1
        if not self.chunk_graphs:
            seq_lens = self._load(work, batch, pending, chunk=True)
            return self._forward_chunk(batch, seq_lens,
                                       self.context_cap_for(self.context_caps, seq_lens))[
                :len(work)]
        with torch.cuda.device(self.device):
            seq_lens = self._load(work, batch, pending, chunk=True)
            self.chunk_graphs[batch, self.context_cap_for(self.context_caps, seq_lens)].replay()
        return self._logits[batch][:len(work)]

    @torch.inference_mode()
    def run(self, work: list[ScheduledSeq], pending: PendingInputs | None = None
            ) -> torch.Tensor | None:
        """Logits ([n, V] in ``compute_logits``'s dtype, in ``work`` order) of a decode step or
        of a step of decodes plus one prompt chunk, or None if the step must run eagerly.
        ``pending``: the rows whose input id is one the previous step sampled, on the device.
        The result is a view of the graph's output: read it before the next step."""
        batch = self.batch_size_for(work)
        if batch is None:
            chunk_batch = self.chunk_batch_for(work)
            return None if chunk_batch is None else self._run_chunk(work, chunk_batch, pending)
        if not self.graphs:
            seq_lens = self._load(work, batch, pending)
            return self._forward(batch, seq_lens + [1] * (batch - len(work)),
                                 self.context_cap_for(self.decode_caps[batch], seq_lens))[
                :len(work)]
        with torch.cuda.device(self.device):
            key = (batch, self.context_cap_for(self.decode_caps[batch],
                                               self._load(work, batch, pending)))
            self.graphs[key].replay()
        self.last_replayed = key
        return self._logits[batch][:len(work)]

    def _capture(self, forward, batch: int, pool, stream: torch.cuda.Stream,
                 warm_up: bool) -> torch.cuda.CUDAGraph:
        """Capture ``forward`` (-> logits) for batch size ``batch``, after one run if
        ``warm_up``. The graphs of one batch size share one output (logits are the bulk of the
        pool): the first captured owns it, the later ones copy into its first rows."""
        if warm_up:
            forward()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            out = forward()
            if batch in self._logits:
                self._logits[batch][:out.shape[0]].copy_(out)
            else:
                self._logits[batch] = out
            del out
        return graph

    def _forwards(self) -> Iterator[tuple[dict, tuple[int, int], Callable[[], torch.Tensor]]]:
        """Each graph's table, key (batch size, context cap) and forward, largest batch first
        (a batch's chunk graphs before its decode graphs: their logits hold b + 1 rows), the
        forward's inputs (padding rows) loaded as it comes."""
        for batch in reversed(self.batch_sizes):
            if self.chunk_layout is not None:
                padding = self._load([], batch, chunk=True)
                for cap in self.context_caps:
                    yield (self.chunk_graphs, (batch, cap),
                           partial(self._forward_chunk, batch, padding, cap))
            self._load([], batch)
            for cap in self.decode_caps[batch]:
                yield self.graphs, (batch, cap), partial(self._forward, batch, [1] * batch, cap)

    @property
    def num_forwards(self) -> int:
        """How many padded forwards there are (one per graph): the parts ``forward_parts``
        yields."""
        return (sum(map(len, self.decode_caps.values()))
                + bool(self.chunk_layout) * len(self.batch_sizes) * len(self.context_caps))

    @cached_property
    def capture_stream(self) -> torch.cuda.Stream:
        """The stream the graphs are captured on (made at the first use)."""
        return torch.cuda.Stream(self.device)

    def forward_parts(self, capture: bool) -> Iterator[Callable[[], object]]:
        """Each padded forward (each graph's, in capture order), for ``meet_kernels``, run
        with ``capture`` on the capture stream: a forward that ran for real there needs no
        other run before its capture (its lazy set-up, cuBLAS's included, is done)."""
        for _, _, forward in self._forwards():
            yield partial(self._on_capture_stream, forward) if capture else forward

    def _on_capture_stream(self, forward: Callable[[], torch.Tensor]) -> None:
        with torch.cuda.device(self.device):
            current, stream = torch.cuda.current_stream(self.device), self.capture_stream
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                forward()
            current.wait_stream(stream)

    @torch.inference_mode()
    def compile_kernels(self, capture: bool = False) -> list[int]:
        """Run every padded forward (each graph's) once within ``meet_kernels``: their Triton
        kernel variants compile side by side, before any step needs them. ``capture`` starts
        so unless told which forwards to run again; run eagerly (``enforce_eager``), padded
        steps call it at start-up instead of compiling each batch size's variants at its first
        step. Returns the positions (in ``_forwards``' order) of the forwards that have not run
        for real yet (with ``capture``: on the capture stream)."""
        return meet_kernels(self.forward_parts(capture), every=self.model.tp.size > 1)

    @torch.inference_mode()
    def capture(self, again: Collection[int] | None = None) -> None:
        """Capture one graph per batch size and context cap (and with ``chunk_tokens`` one of
        decodes beside a prompt chunk per batch size and cap), largest first, into one shared
        memory pool.

        Call once the KV cache exists. Inputs during warm-up and capture are all padding rows,
        so nothing is written to the KV cache. A forward that has not run for real on the
        capture stream (``again``: its position in ``forward_parts``, as ``meet_kernels`` over
        ``forward_parts(capture=True)`` answers; by default the forwards meet their kernels
        here first, ``compile_kernels``) runs once more before its capture."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        t0 = time.perf_counter()
        with torch.cuda.device(self.device):
            again = set(self.compile_kernels(capture=True) if again is None else again)
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # so that the reserved-memory difference is the graphs'
            reserved = torch.cuda.memory_reserved(self.device)
            pool = torch.cuda.graph_pool_handle()
            stream = self.capture_stream
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for index, (graphs, key, forward) in enumerate(self._forwards()):
                    graphs[key] = self._capture(forward, key[0], pool, stream, index in again)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # warm-up memory; the graphs' pool stays
            self.capture_bytes = torch.cuda.memory_reserved(self.device) - reserved
        self.capture_seconds = time.perf_counter() - t0
        logger.info("captured %d decode CUDA graphs (batch %d..%d, contexts up to %s) and %d "
                    "with a %d-token prompt chunk (contexts up to %s) in %.1f s, %.0f MiB",
                    len(self.graphs), self.batch_sizes[0], self.batch_sizes[-1],
                    " / ".join(map(str, sorted({c for caps in self.decode_caps.values()
                                                for c in caps}))),
                    len(self.chunk_graphs), self.chunk_layout.chunk if self.chunk_layout else 0,
                    " / ".join(map(str, self.context_caps)),
                    self.capture_seconds, self.capture_bytes / 2**20)
