"""Choosing how to preempt a sequence: swap its KV to the tier, or drop it and recompute.

``auto`` compares the two costs from figures measured while the engine runs: swapping moves the
sequence's KV bytes out and back in at the tier's measured bandwidth; recomputing re-prefills
its tokens at the measured prefill speed. Until both are measured, swapping is assumed cheaper.
"""
from __future__ import annotations

import enum

from hifc.options import check_choice

PREEMPTION_MODES = ("recompute", "swap", "auto")


class PreemptionMode(enum.Enum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


class RateMeter:
    """Exponentially weighted units per second (bytes/s, tokens/s)."""

    def __init__(self, weight: float = 0.3):
        self.weight = weight
        self.rate: float | None = None

    def add(self, units: float, seconds: float) -> None:
        if units <= 0 or seconds <= 0:
            return
        sample = units / seconds
        self.rate = sample if self.rate is None else (
            (1 - self.weight) * self.rate + self.weight * sample)


class PreemptionPolicy:
    def __init__(self, mode: str, block_bytes: int):
        check_choice("preemption", mode, PREEMPTION_MODES)
        self.mode = mode
        self.block_bytes = block_bytes
        self.tier_bandwidth = RateMeter()  # bytes/s over completed swap jobs
        self.prefill_speed = RateMeter()  # tokens/s over prefill steps

    def choose(self, num_blocks: int, num_tokens: int) -> PreemptionMode:
        if self.mode == "recompute":
            return PreemptionMode.RECOMPUTE
        if self.mode == "swap":
            return PreemptionMode.SWAP
        bw, speed = self.tier_bandwidth.rate, self.prefill_speed.rate
        if bw is None or speed is None:
            return PreemptionMode.SWAP
        swap_seconds = 2 * num_blocks * self.block_bytes / bw
        recompute_seconds = num_tokens / speed
        return PreemptionMode.SWAP if swap_seconds <= recompute_seconds else PreemptionMode.RECOMPUTE
