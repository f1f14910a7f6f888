"""The batched sampler against a straightforward per-row, per-token reference of the same
formulas (vLLM's): masks, logit bias, min_tokens bans, penalties, min-p, top-k/top-p, seeded
draws and log-probabilities."""
from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

from hifc.core.sequence import Sequence
from hifc.layers import sampling_ops
from hifc.layers.sampler import Sampler
from hifc.runtime.sampling_inputs import (PenaltyRows, StepConstraints, StepPacker,
                                          build_sampling_batch)
from hifc.sampling_params import SamplingParams

VOCAB = 40
EOS = frozenset({0})
CPU = torch.device("cpu")


def _seq(i: int, prompt: list[int], output: list[int], params: SamplingParams) -> Sequence:
    seq = Sequence(f"r{i}", prompt, params, EOS, i)
    for t in output:
        seq.append_token(t)
    return seq


def _batch(seqs, constraints=None, pool=None):
    return build_sampling_batch(seqs, constraints, pool or PenaltyRows(VOCAB, CPU),
                                StepPacker(CPU), VOCAB)


def reference_logits(logits: list[float], seq: Sequence, banned: list[int]) -> list[float]:
    """vLLM's processing of one row, token by token: allowed ids, bans (bad words, stop tokens
    before min_tokens), logit bias, then the repetition, frequency and presence penalties."""
    p = seq.sampling_params
    out = list(logits)
    allowed = set(p.allowed_token_ids or range(VOCAB))
    if len(seq.output_token_ids) < p.min_tokens:
        banned = banned + list(seq.stop_token_ids_before_min_tokens())
    for t in range(VOCAB):
        if t not in allowed or t in banned:
            out[t] = -math.inf
    for t, bias in (p.logit_bias or {}).items():
        out[t] += bias
    counts = Counter(seq.output_token_ids)
    seen = set(seq.prompt_token_ids) | set(counts)
    for t in range(VOCAB):
        if t in seen:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else \
                out[t] * p.repetition_penalty
        out[t] -= p.frequency_penalty * counts[t]
        if counts[t]:
            out[t] -= p.presence_penalty
    return out


def _random_params(rng: random.Random) -> SamplingParams:
    features = dict(
        presence_penalty=rng.choice([0.0, rng.uniform(-2, 2)]),
        frequency_penalty=rng.choice([0.0, rng.uniform(-2, 2)]),
        repetition_penalty=rng.choice([1.0, rng.uniform(0.5, 2.0)]),
        min_tokens=rng.choice([0, 0, 3, 8]),
        logit_bias=rng.choice([None, {rng.randrange(VOCAB): rng.uniform(-5, 5)
                                      for _ in range(3)}]),
        allowed_token_ids=rng.choice([None, rng.sample(range(VOCAB), 12)]),
        stop_token_ids=rng.choice([(), (rng.randrange(1, VOCAB),)]),
        ignore_eos=rng.random() < 0.3)
    return SamplingParams(temperature=0.0, max_tokens=32, **features)


def test_processed_logits_match_the_reference_formulas():
    rng = random.Random(0)
    torch.manual_seed(0)
    pool = PenaltyRows(VOCAB, CPU, initial_rows=2)  # grows while the test runs
    for _ in range(6):  # several steps: the pool's counts follow the outputs as they grow
        seqs = [_seq(i, [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))],
                     [rng.randrange(VOCAB) for _ in range(rng.randint(0, 10))],
                     _random_params(rng)) for i in range(12)]
        banned = {i: rng.sample(range(VOCAB), 2) for i in range(0, 12, 3)}
        constraints = StepConstraints([i for i, b in banned.items() for _ in b],
                                      [t for b in banned.values() for t in b])
        logits = torch.randn(len(seqs), VOCAB) * 3
        expected = torch.tensor([reference_logits(row, s, banned.get(i, []))
                                 for i, (row, s) in enumerate(zip(logits.tolist(), seqs))])
        got = Sampler.process(logits.clone(), _batch(seqs, constraints, pool))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        greedy = Sampler().sample(logits.clone(), _batch(seqs, constraints, pool),
                                  torch.Generator().manual_seed(0)).token_ids
        assert greedy.tolist() == expected.argmax(-1).tolist()


def test_penalty_rows_follow_growing_outputs_and_reused_ids():
    pool = PenaltyRows(VOCAB, CPU, initial_rows=1)
    params = SamplingParams(frequency_penalty=1.0, temperature=0)
    seq = _seq(0, [1], [5, 5], params)
    logits = torch.zeros(1, VOCAB)
    assert Sampler.process(logits.clone(), _batch([seq], pool=pool))[0, 5] == -2.0
    seq.append_token(5)
    assert Sampler.process(logits.clone(), _batch([seq], pool=pool))[0, 5] == -3.0
    seq.status = seq.status.FINISHED_STOPPED
    pool.release([seq.request_id])
    reused = _seq(0, [1], [7], params)  # the same request id, a new request
    processed = Sampler.process(logits.clone(), _batch([reused], pool=pool))
    assert processed[0, 5] == 0.0 and processed[0, 7] == -1.0


def _reference_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, then min-p, top-k, top-p over one row, token by token."""
    probs = torch.softmax(logits / p.temperature, -1).tolist()
    keep = [q >= p.min_p * max(probs) for q in probs]
    order = sorted(range(len(probs)), key=lambda t: -probs[t])
    if p.top_k > 0:
        for t in order[p.top_k:]:
            keep[t] = False
    kept = [q if k else 0.0 for q, k in zip(probs, keep)]
    total, mass = sum(kept), 0.0
    for rank, t in enumerate(order):
        if kept[t] and rank > 0 and mass >= p.top_p:
            keep[t] = False
        mass += kept[t] / total
    kept = torch.tensor([q if k else 0.0 for q, k in zip(probs, keep)])
    return kept / kept.sum()


@pytest.mark.parametrize("features", [dict(min_p=0.1), dict(top_k=5), dict(top_p=0.8),
                                      dict(min_p=0.05, top_k=8, top_p=0.9, temperature=0.7)])
def test_seeded_draws_follow_the_truncated_distribution(features):
    torch.manual_seed(1)
    logits = torch.randn(VOCAB) * 2
    params = SamplingParams(seed=123, **{"temperature": 1.0, **features})
    draws = 3000
    seqs = [_seq(0, [1], [], params) for _ in range(draws)]
    for i, s in enumerate(seqs):
        s.output_token_ids = [1] * i  # step i of the same request: draw i of its noise
    batch = _batch(seqs)
    tokens = Sampler().sample(logits.repeat(draws, 1), batch, torch.Generator()).token_ids
    freq = torch.bincount(tokens, minlength=VOCAB).float() / draws
    ref = _reference_probs(logits, params)
    assert set(tokens.tolist()) <= set(ref.nonzero().flatten().tolist())
    assert (freq - ref).abs().sum() / 2 < 0.05  # total variation distance


def test_seeded_rows_do_not_depend_on_their_batch():
    torch.manual_seed(2)
    logits = torch.randn(6, VOCAB)
    seeded = SamplingParams(seed=7, temperature=1.0)
    others = [SamplingParams(temperature=1.0), SamplingParams(temperature=0),
              SamplingParams(seed=8, temperature=0.5, top_k=4)]

    def draw(rows: list[tuple[int, SamplingParams]], generator_seed: int) -> list[int]:
        seqs = [_seq(i, [1], [2, 3], p) for i, (_, p) in enumerate(rows)]
        batch_logits = torch.stack([logits[r] for r, _ in rows])
        gen = torch.Generator().manual_seed(generator_seed)
        return Sampler().sample(batch_logits, _batch(seqs), gen).token_ids.tolist()

    alone = [draw([(r, seeded)], 0)[0] for r in range(6)]
    mixed = draw([(0, others[0]), (1, seeded), (2, others[1]), (3, seeded), (4, others[2]),
                  (5, seeded)], 1)
    assert [mixed[1], mixed[3], mixed[5]] == [alone[1], alone[3], alone[5]]
    assert mixed[2] == int(logits[2].argmax())  # greedy row


def test_seeded_uniforms_depend_only_on_seed_and_step():
    seeds = [0, 0, 1, 2**62 + 5] * 2500
    steps = [i // 4 for i in range(10000)]
    u = sampling_ops.seeded_uniform(seeds, steps)
    assert u.dtype == np.float32 and ((u > 0) & (u < 1)).all()
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    firsts = sampling_ops.seeded_uniform([0, 1, 0, 2**62], [0, 0, 1, 0])
    assert len(set(firsts.tolist())) == 4 and firsts.min() > 1e-3  # no fixed point at 0
    again = sampling_ops.seeded_uniform(seeds[2::4][:7], steps[2::4][:7])
    assert np.array_equal(again, u[2::4][:7])


@pytest.mark.parametrize("vocab", [7, 1024, 2500])
def test_two_level_inverse_cdf_draws_what_one_full_scan_draws(vocab):
    gen = torch.Generator().manual_seed(vocab)
    probs = torch.softmax(3 * torch.randn(16, vocab, generator=gen), dim=-1)
    probs[probs < 1e-5] = 0.0  # zero-probability tokens inside and between chunks
    uniform = torch.rand(16, generator=gen).clamp(1e-6, 1 - 1e-6)
    cdf = probs.cumsum(dim=-1)
    full_scan = torch.searchsorted(cdf, uniform[:, None] * cdf[:, -1:], right=True).squeeze(1)
    for chunk in (4, 64, 1024):
        drawn = sampling_ops.sample_inverse_cdf(probs, uniform, chunk=chunk)
        assert torch.equal(drawn, full_scan)
        assert (probs.gather(1, drawn[:, None]) > 0).all()


def test_inverse_cdf_never_draws_a_token_of_probability_zero():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 5)
    uniform = torch.tensor([1e-7, 0.25, 0.5, 0.75, 1 - 1e-7])
    assert sampling_ops.sample_inverse_cdf(probs, uniform).tolist() == [1, 1, 3, 3, 3]
    unnormalized = probs * 3  # draws scale with the total
    assert sampling_ops.sample_inverse_cdf(unnormalized, uniform).tolist() == [1, 1, 3, 3, 3]
    assert sampling_ops.sample_inverse_cdf(probs, uniform, chunk=2).tolist() == [1, 1, 3, 3, 3]


def test_logprobs_are_the_raw_distribution_with_ranks_and_top_k():
    torch.manual_seed(3)
    logits = torch.randn(4, VOCAB)
    params = [SamplingParams(temperature=0, logprobs=3, presence_penalty=1.5),
              SamplingParams(temperature=1.0, seed=1, logprobs=0),
              SamplingParams(temperature=0.5, seed=2, top_k=3),
              SamplingParams(temperature=0, logit_bias={5: 50.0}, logprobs=1)]
    seqs = [_seq(i, [1, 2], [3], p) for i, p in enumerate(params)]
    out = Sampler().sample(logits.clone(), _batch(seqs), torch.Generator())
    raw = torch.log_softmax(logits, -1)
    assert out.top_ids.shape == (4, 3)  # the largest k asked for
    for i, token in enumerate(out.token_ids.tolist()):
        assert out.logprobs[i].item() == pytest.approx(raw[i, token].item(), abs=1e-6)
        assert out.ranks[i].item() == 1 + int((raw[i] > raw[i, token]).sum())
        torch.testing.assert_close(out.top_logprobs[i], raw[i].topk(3).values)
    assert out.token_ids[3].item() == 5  # chosen under the bias, logprob of the raw logits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_logits_sample_as_their_float32_values(dtype):
    """The model's 16-bit logits: a plain greedy step takes their argmax as they come (ties to
    the first column), any other step their float32 values; both as float32 logits would."""
    torch.manual_seed(5)
    logits = (torch.randn(5, VOCAB) * 4).to(dtype)
    logits[0, 7] = logits[0, 3] = logits[0].max() + 1  # a tie: the first column
    plain = [SamplingParams(temperature=0) for _ in range(5)]
    mixed = [SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=2),
             SamplingParams(temperature=0.7, seed=4), SamplingParams(temperature=0, min_tokens=2),
             SamplingParams(temperature=0, presence_penalty=1.0)]
    for params in (plain, mixed):
        seqs = [_seq(i, [1, 2], [3], p) for i, p in enumerate(params)]
        ours = Sampler().sample(logits.clone(), _batch(seqs), torch.Generator().manual_seed(1))
        ref = Sampler().sample(logits.float(), _batch(seqs), torch.Generator().manual_seed(1))
        assert ours.token_ids.tolist() == ref.token_ids.tolist()
        assert ours.token_ids[0].item() == 3
        for a, b in zip((ours.logprobs, ours.top_logprobs), (ref.logprobs, ref.top_logprobs)):
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_grammar_bitmask_matches_xgrammar():
    xgr = pytest.importorskip("xgrammar")
    torch.manual_seed(4)
    vocab = 100
    bitmask = torch.randint(-2**31, 2**31 - 1, (5, 4), dtype=torch.int32)  # a row per row
    logits = torch.randn(5, vocab)
    ours = logits.clone()  # takes the bitmasks of the masked rows only
    sampling_ops.apply_token_bitmask(ours, torch.tensor([0, 2, 4]), bitmask[[0, 2, 4]])
    theirs = logits.clone()
    xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=vocab, indices=[0, 2, 4])
    assert torch.equal(ours, theirs)


def test_packed_step_vectors_keep_their_values_and_start_16_byte_aligned():
    """Triton compiles a kernel again for a pointer whose alignment changed: every vector of a
    step starts 16-byte aligned, whatever the lengths before it."""
    ints = {"a": [1, 2, 3], "b": [4], "empty": [], "c": [5, 6]}
    floats = {"x": [0.5, 1.5, 2.5], "y": [3.0]}
    out = StepPacker(CPU).pack(ints, floats)
    for name, values in {**ints, **floats}.items():
        assert out[name].tolist() == values
        if values:
            assert out[name].data_ptr() % 16 == 0, name
    assert out["a"].dtype == torch.int64 and out["x"].dtype == torch.float32


def test_warm_up_runs_every_pass_and_leaves_16_bit_logits_as_they_are():
    """``Sampler.warm_up`` (start-up: the passes that compile on CUDA) reads a warm-up step's
    logits of any row count; 16-bit ones it edits only in a float32 copy."""
    torch.manual_seed(2)
    for rows in (1, 3):
        logits = (torch.randn(rows, VOCAB) * 4).to(torch.bfloat16)
        before = logits.clone()
        Sampler.warm_up(logits)
        assert torch.equal(logits, before)


@pytest.mark.parametrize("extra", [dict(), dict(top_k=1, temperature=0.7), dict(min_tokens=2),
                                   dict(logprobs=0), dict(logit_bias={3: 1.0}),
                                   dict(allowed_token_ids=[1, 2]),
                                   dict(repetition_penalty=1.2), dict(temperature=0.5)])
def test_a_step_of_plain_greedy_rows_packs_nothing_and_takes_the_argmax(extra):
    """Rows that are greedy with nothing else to apply give a batch of no tensors, whose sample
    is the argmax; any feature on one row (or a step's constraints) takes the full batch, and
    the greedy rows' tokens stay the argmax either way."""
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    plain = SamplingParams(temperature=0.0, max_tokens=8)
    seqs = [_seq(0, [4, 5], [], plain), _seq(1, [6], [7], plain),
            _seq(2, [8], [], SamplingParams(max_tokens=8, **{"temperature": 0.0, **extra}))]
    packed = bool(extra) and "top_k" not in extra  # top_k=1 is greedy, with nothing else
    batch = _batch(seqs)
    assert (batch.temperature is not None) == packed
    assert batch.all_greedy == (extra.get("temperature", 0.0) == 0.0 or "top_k" in extra)
    tokens = Sampler().sample(logits.clone(), batch, torch.Generator().manual_seed(0)).token_ids
    assert tokens[:2].tolist() == logits[:2].argmax(-1).tolist()
    if not packed:
        assert tokens.tolist() == logits.argmax(-1).tolist()
        assert _batch(seqs, StepConstraints()).temperature is not None  # a step's constraints
