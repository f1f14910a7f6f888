"""Token sampling: greedy, temperature, top-k, top-p, with optional per-request generators."""
from __future__ import annotations

import torch

from hifc.core.outputs import SamplerOutput
from hifc.sampling_params import SamplingParams


class Sampler:
    def sample(self, logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None],
               default_generator: torch.Generator) -> SamplerOutput:
        """logits [B, V] float32 -> one token id per row."""
        greedy_ids = logits.argmax(dim=-1)  # [B]
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if not random_rows:
            return SamplerOutput(greedy_ids.tolist())
        rows = torch.tensor(random_rows, device=logits.device)
        sub = logits.index_select(0, rows)  # [R, V]
        sub_params = [params[i] for i in random_rows]
        temps = torch.tensor([p.temperature for p in sub_params], device=logits.device)
        sub = sub / temps[:, None]
        sub = _apply_top_k_top_p(sub, sub_params)
        probs = torch.softmax(sub, dim=-1)
        noise = torch.empty_like(probs)
        for j, i in enumerate(random_rows):
            noise[j].exponential_(generator=generators[i] or default_generator)
        sampled = (probs / noise).argmax(dim=-1)  # exponential race == multinomial draw
        result = greedy_ids.clone()
        result[rows] = sampled
        return SamplerOutput(result.tolist())


def _apply_top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Mask logits [R, V] outside each row's top-k and top-p sets with -inf."""
    vocab = logits.shape[-1]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    ps = [p.top_p for p in params]
    if all(k == vocab for k in ks) and all(p >= 1.0 for p in ps):
        return logits
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    k = torch.tensor(ks, device=logits.device)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    mask = ranks >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(mask, float("-inf")), dim=-1)
    cum_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
    p = torch.tensor(ps, device=logits.device, dtype=probs.dtype)
    mask |= cum_before >= p[:, None]
    mask[:, 0] = False  # always keep the best token
    sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)
