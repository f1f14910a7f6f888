"""Benchmark workloads: LongBench-like length profiles and fixed lengths, as token-id requests.

Profiles draw input lengths from a log-normal around the dataset's mean input length (sigma 0.35,
clipped to [0.25, 2] x mean) and use LongBench's maximum generation length for the dataset as
the output length. Prompts are random token ids from a seeded generator: the throughput of a
decoder does not depend on which tokens it reads.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    mean_input_tokens: int
    output_tokens: int


PROFILES = {
    "qasper": Profile("qasper", 3600, 128),
    "govreport": Profile("govreport", 8700, 512),
    "narrativeqa": Profile("narrativeqa", 18400, 128),
}


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_tokens: int


def profile_requests(profile: Profile, num_prompts: int, vocab_size: int, max_model_len: int,
                     seed: int = 0) -> list[BenchRequest]:
    rng = random.Random(seed)
    limit = max_model_len - profile.output_tokens
    if limit < 1:
        raise ValueError(f"max_model_len {max_model_len} leaves no room for {profile.name}'s "
                         f"{profile.output_tokens} output tokens")
    mean = profile.mean_input_tokens
    sigma = 0.35
    mu = math.log(mean) - sigma * sigma / 2  # so that the mean stays `mean`
    requests = []
    for _ in range(num_prompts):
        n = int(min(max(rng.lognormvariate(mu, sigma), 0.25 * mean), 2 * mean, limit))
        requests.append(BenchRequest(_random_ids(rng, max(n, 1), vocab_size),
                                     profile.output_tokens))
    return requests


def fixed_requests(input_len: int, output_len: int, num_prompts: int, vocab_size: int,
                   seed: int = 0) -> list[BenchRequest]:
    if input_len < 1 or output_len < 1:
        raise ValueError("--input-len and --output-len must be positive")
    rng = random.Random(seed)
    return [BenchRequest(_random_ids(rng, input_len, vocab_size), output_len)
            for _ in range(num_prompts)]


def _random_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(3, vocab_size) for _ in range(n)]  # skip the usual special ids 0..2
