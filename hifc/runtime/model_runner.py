"""Runs one scheduled step on the device: inputs -> model -> logits -> sampled tokens."""
from __future__ import annotations

import torch

from hifc.core.scheduler import SchedulerOutput
from hifc.layers.attention import AttentionBackend, AttentionContext
from hifc.layers.sampler import Sampler
from hifc.runtime import inputs


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: torch.Tensor, backend: AttentionBackend,
                 block_size: int, head_dim: int, device: torch.device, seed: int):
        self.model = model
        self.kv_cache = kv_cache  # [L, 2, NB, BS, Hkv, D]
        self.kv_caches = list(kv_cache.unbind(0))  # per layer [2, NB, BS, Hkv, D]
        self.backend = backend
        self.block_size = block_size
        self.scale = head_dim ** -0.5
        self.device = device
        self.sampler = Sampler()
        self.default_generator = torch.Generator(device=device)
        self.default_generator.manual_seed(seed)
        self._generators: dict[str, torch.Generator] = {}  # per seeded request

    def _generator_for(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> list[int]:
        """Compute the scheduled tokens' K/V and return one sampled token per sequence."""
        for request_id in out.finished_request_ids:
            self._generators.pop(request_id, None)
        work = out.scheduled
        if not work:
            return []
        meta = inputs.build_attention_metadata(work, self.block_size, self.device)
        ctx = AttentionContext(meta, self.kv_caches, self.backend, self.scale)
        input_ids = inputs.build_input_ids(work, self.device)
        positions = inputs.build_positions(work, self.device)
        hidden = self.model(input_ids, positions, ctx)  # [T, hidden]
        last = inputs.build_logits_indices(meta.query_start_loc_cpu, self.device)
        logits = self.model.compute_logits(hidden.index_select(0, last))  # [B, V]
        params = [w.sampling_params for w in work]
        gens = [self._generator_for(w.request_id, w.sampling_params.seed) for w in work]
        return self.sampler.sample(logits, params, gens, self.default_generator)
