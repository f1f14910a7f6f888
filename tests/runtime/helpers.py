"""Shared helpers of the runtime tests."""
from __future__ import annotations

import random

import pytest

from hifc.core.scheduler import ScheduledSeq
from hifc.layers.attention import (TorchAttentionBackend, reference_paged_attention,
                                   write_kv_cache)
from hifc.sampling_params import SamplingParams


class SkipPaddingReference(TorchAttentionBackend):
    """The torch reference backend, except that padding slots (< 0) are not written, as the
    Triton KV write does: lets padded decode batches run on CPU."""

    def forward(self, q, k, v, kv_cache, meta, scale, sliding_window=None, logit_softcap=None,
                kv_scale=None, *, rope=None):
        if rope is not None:
            q, k = rope.rotary(rope.positions, q, k)
        keep = meta.slot_mapping >= 0
        write_kv_cache(k[keep], v[keep], kv_cache, meta.slot_mapping[keep], kv_scale)
        return reference_paged_attention(q, kv_cache, meta, scale, sliding_window, logit_softcap,
                                         kv_scale)


def chunk_work(decode_lens: list[int], chunk_start: int, chunk_len: int, block_size: int,
               seed: int = 0, samples: bool = False) -> list[ScheduledSeq]:
    """A step of decodes of these lengths, then a prompt chunk of chunk_len tokens after
    chunk_start computed ones (disjoint shuffled blocks)."""
    work = decode_work(decode_lens + [chunk_start + chunk_len], block_size, seed=seed)
    last = work[-1]
    work[-1] = ScheduledSeq(last.request_id, [7 + i % 100 for i in range(chunk_len)], chunk_start,
                            last.block_table, SamplingParams(), samples=samples)
    return work


def decode_work(seq_lens: list[int], block_size: int, seed: int = 0,
                vocab: int = 512) -> list[ScheduledSeq]:
    """One decode step (one new token each) for sequences of these lengths, disjoint shuffled
    blocks."""
    rng = random.Random(seed)
    need = [-(-n // block_size) for n in seq_lens]
    free = list(range(sum(need) + 3))
    rng.shuffle(free)
    work = []
    for i, (n, nb) in enumerate(zip(seq_lens, need)):
        table = [free.pop() for _ in range(nb)]
        work.append(ScheduledSeq(f"r{i}", [rng.randrange(vocab)], n - 1, table, SamplingParams()))
    return work


def random_prompts(n: int, lengths: tuple[int, int], seed: int = 0,
                   vocab: int = 512) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def staggered(n: int, max_tokens: int = 8, step: int = 3, temperature: float = 0.0,
              seed: int | None = None) -> list[SamplingParams]:
    """max_tokens, max_tokens + step, ...: the batch shrinks one sequence at a time, crossing the
    padded/captured batch sizes. With a seed, sequence i samples with seed + i."""
    return [SamplingParams(max_tokens=max_tokens + step * i, temperature=temperature,
                           ignore_eos=True, seed=None if seed is None else seed + i)
            for i in range(n)]


def output_tokens(llm, prompts, params) -> list[list[int]]:
    """The generated token ids of each prompt."""
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_same_outputs_and_prompt_logprobs(got, ref, prompts, tol: float) -> None:
    """``got`` and ``ref`` (RequestOutputs of ``prompts``) have the same tokens; the last
    request's prompt logprobs cover its prompt and match ``ref``'s within ``tol``."""
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    assert len(got[-1].prompt_logprobs) == len(prompts[-1])
    for mine, theirs in zip(got[-1].prompt_logprobs[1:], ref[-1].prompt_logprobs[1:]):
        assert mine.keys() == theirs.keys()
        assert [p.logprob for p in mine.values()] == pytest.approx(
            [p.logprob for p in theirs.values()], abs=tol)
