"""Runs one scheduled step on the device: inputs -> model -> logits -> sampled tokens."""
from __future__ import annotations

import logging

import torch

from hifc.core.outputs import SamplerOutput
from hifc.core.scheduler import ScheduledSeq, SchedulerOutput
from hifc.layers.attention import AttentionBackend, AttentionContext
from hifc.layers.sampler import Sampler
from hifc.runtime import inputs
from hifc.runtime.cuda_graphs import DecodeGraphs, capture_sizes, graphs_unsupported_reason

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: torch.Tensor, backend: AttentionBackend,
                 block_size: int, device: torch.device, seed: int,
                 kv_scales: torch.Tensor | None = None):
        self.model = model  # with attention_layers: each layer's LayerAttention
        self.kv_cache = kv_cache  # [L, 2, NB, BS, Hkv, D]
        self.kv_caches = list(kv_cache.unbind(0))  # per layer [2, NB, BS, Hkv, D]
        # a float8 cache's scales: per layer [2 (K, V), Hkv] float32 on the device
        self.kv_scales = list(kv_scales.unbind(0)) if kv_scales is not None else None
        self.backend = backend
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self.default_generator = torch.Generator(device=device)
        self.default_generator.manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}  # per seeded request
        self.decode_graphs: DecodeGraphs | None = None
        self.num_padded_decode_steps = 0  # steps run through decode_graphs (replayed or not)

    def _generator_for(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    def setup_padded_decode(self, max_model_len: int, max_num_seqs: int, capture: bool) -> None:
        """Run decode-only steps padded to the batch sizes of ``capture_sizes`` from persistent
        input buffers, if this device and backend allow it: replayed from CUDA graphs captured
        now (capture=True), or the same padded computation run eagerly (capture=False, which
        ``enforce_eager`` picks, so that eager and graph runs compute bit-identical logits: the
        matrix kernels' results depend on the batch size they run at). Where padding is not
        possible here, decode steps run unpadded."""
        num_slots = self.kv_cache.shape[2] * self.block_size
        reason = graphs_unsupported_reason(self.device, self.backend, num_slots)
        if reason is not None:
            logger.info("decode steps run unpadded (no CUDA graphs): %s", reason)
            return
        self.use_padded_decode(max_model_len, capture_sizes(max_num_seqs), capture=capture)

    def use_padded_decode(self, max_model_len: int, batch_sizes: list[int],
                          capture: bool) -> None:
        """Run decode-only steps of up to max(batch_sizes) sequences padded to the next size,
        from persistent input buffers: replayed from CUDA graphs captured now (capture=True,
        CUDA only) or run eagerly (capture=False: the same computation)."""
        graphs = DecodeGraphs(self.model, self.kv_caches, self.backend, self.block_size,
                              max_model_len, batch_sizes, self.device, self.kv_scales)
        if capture:
            graphs.capture()
        self.decode_graphs = graphs

    @property
    def num_graph_decode_steps(self) -> int:
        """Decode steps replayed from a CUDA graph."""
        graphs = self.decode_graphs
        return self.num_padded_decode_steps if graphs is not None and graphs.graphs else 0

    def eager_logits(self, work: list[ScheduledSeq]) -> torch.Tensor:
        """Compute the step's K/V from unpadded inputs; returns the logits ([S, V]) of the last
        new token of each sequence that samples (S may be 0: prompt chunks only)."""
        meta = inputs.build_attention_metadata(work, self.block_size, self.device)
        ctx = AttentionContext(meta, self.kv_caches, self.backend, self.model.attention_layers,
                               self.kv_scales)
        input_ids = inputs.build_input_ids(work, self.device)
        positions = inputs.build_positions(work, self.device)
        hidden = self.model(input_ids, positions, ctx)  # [T, hidden]
        last = inputs.build_logits_indices(work, meta.query_start_loc_cpu, self.device)
        return self.model.compute_logits(hidden.index_select(0, last))  # [S, V]

    def _padded_logits(self, work: list[ScheduledSeq]) -> torch.Tensor | None:
        """Logits ([S, V]) of the samplers of a decode-only step run padded (None: the step
        runs eagerly). A one-token prompt chunk before the last is such a row, not sampled."""
        logits = self.decode_graphs.run(work) if self.decode_graphs is not None else None
        if logits is None:
            return None
        self.num_padded_decode_steps += 1
        if all(w.samples for w in work):
            return logits  # [B, V]
        rows = [i for i, w in enumerate(work) if w.samples]
        return logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> SamplerOutput:
        """Compute the scheduled tokens' K/V and sample one token per sequence that finishes
        its known tokens in this step (``ScheduledSeq.samples``)."""
        for request_id in out.finished_request_ids:
            self._generators.pop(request_id, None)
        work = out.scheduled
        if not work:
            return SamplerOutput([])
        logits = self._padded_logits(work)
        if logits is None:
            logits = self.eager_logits(work)  # [S, V]
        sampling = out.sampling
        if not sampling:
            return SamplerOutput([])
        params = [w.sampling_params for w in sampling]
        gens = [self._generator_for(w.request_id, w.sampling_params.seed) for w in sampling]
        return self.sampler.sample(logits, params, gens, self.default_generator)
