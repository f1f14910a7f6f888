"""Tier block write traces: read from a file, or generated from a synthetic swap workload.

A trace is the flash tier's block ids in write order, grouped by swap-out (one group = the
blocks of one evicted sequence). File formats:
  text  one swap-out per line, block ids separated by spaces or commas; `#` starts a comment;
        blank lines are skipped. One id per line (the tier allocator's export) is the same as a
        swap-out of one block per line. A comment holding `num_blocks=N` (the allocator's header,
        `# hifc FC block write trace: policy=append num_blocks=N`) gives the tier capacity.
  JSON  a list of ints (one write each), a list of lists of ints (one list per swap-out), or an
        object holding either under the key "block_ids".
Ids are non-negative integers.

The synthetic generator is torch-free and independent of `hifc.tiers`: sequences with a random
number of KV blocks (uniform in [min_seq_blocks, max_seq_blocks]) swap out one after another;
whenever the next one would push the tier past `fill` x tier_blocks resident blocks, resident
sequences swap back in and free their blocks. The scheduler resumes the longest-swapped sequence
first (FIFO, as vLLM's swapped queue does); with probability `churn` it resumes a random one
instead (priorities, aborts, groups finishing out of order), which punches holes into the tier.
Allocation policies:
  append       circular log: each block is the next free one after the last written (wrapping)
  left-append  each block is the lowest-numbered free one
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hifc.analysis.common import InputError, read_text
from hifc.tiers.allocator import POLICIES


@dataclass(frozen=True)
class SwapTrace:
    swap_outs: tuple[np.ndarray, ...]   # each: int64 tier block ids in write order
    source: str
    tier_blocks: int | None = None      # tier capacity in blocks, when the source knows it

    @property
    def block_ids(self) -> np.ndarray:
        if not self.swap_outs:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(self.swap_outs)

    @property
    def num_block_writes(self) -> int:
        return sum(len(group) for group in self.swap_outs)

    @property
    def grouped(self) -> bool:
        return any(len(group) > 1 for group in self.swap_outs)


@dataclass(frozen=True)
class SwapWorkload:
    tier_blocks: int = 2048
    swap_outs: int = 1000
    min_seq_blocks: int = 4
    max_seq_blocks: int = 32
    fill: float = 0.8
    churn: float = 0.2   # probability that a swap-in picks a random resident, not the oldest
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tier_blocks <= 0 or self.swap_outs <= 0:
            raise ValueError("tier_blocks and swap_outs must be > 0")
        if not 0 < self.min_seq_blocks <= self.max_seq_blocks:
            raise ValueError(f"need 0 < min_seq_blocks <= max_seq_blocks, got "
                             f"{self.min_seq_blocks}, {self.max_seq_blocks}")
        if not 0 <= self.churn <= 1:
            raise ValueError(f"churn must be in [0, 1], got {self.churn}")
        if not 0 < self.fill <= 1:
            raise ValueError(f"fill must be in (0, 1], got {self.fill}")
        if self.max_seq_blocks > self.resident_limit:
            raise ValueError(f"a sequence of {self.max_seq_blocks} blocks does not fit in "
                             f"{self.resident_limit} resident blocks (fill x tier_blocks)")

    @property
    def resident_limit(self) -> int:
        return int(self.fill * self.tier_blocks)


def _take_append(free: np.ndarray, cursor: int, count: int) -> np.ndarray:
    ahead = np.flatnonzero(free[cursor:])[:count] + cursor
    if ahead.size == count:
        return ahead
    behind = np.flatnonzero(free[:cursor])[:count - ahead.size]
    return np.concatenate([ahead, behind])


def generate(workload: SwapWorkload, policy: str) -> SwapTrace:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    rng = np.random.default_rng(workload.seed)
    free = np.ones(workload.tier_blocks, dtype=bool)
    resident: list[np.ndarray] = []
    num_resident, cursor = 0, 0
    swap_outs = []
    for _ in range(workload.swap_outs):
        size = int(rng.integers(workload.min_seq_blocks, workload.max_seq_blocks + 1))
        while num_resident + size > workload.resident_limit:
            pick = int(rng.integers(len(resident))) if rng.random() < workload.churn else 0
            blocks = resident.pop(pick)
            free[blocks] = True
            num_resident -= blocks.size
        if policy == "append":
            blocks = _take_append(free, cursor, size)
            cursor = (int(blocks[-1]) + 1) % workload.tier_blocks
        else:
            blocks = np.flatnonzero(free)[:size]
        free[blocks] = False
        num_resident += size
        resident.append(blocks)
        swap_outs.append(blocks.astype(np.int64))
    return SwapTrace(tuple(swap_outs), source=f"synthetic:{policy}",
                     tier_blocks=workload.tier_blocks)


def _groups_from_json(data, source: str) -> list[list[int]]:
    if isinstance(data, dict):
        if "block_ids" not in data:
            raise InputError(f"{source}: JSON object has no 'block_ids' key")
        data = data["block_ids"]
    if not isinstance(data, list):
        raise InputError(f"{source}: expected a JSON list of block ids")
    return [item if isinstance(item, list) else [item] for item in data]


def _capacity_from_comments(text: str) -> int | None:
    match = re.search(r"^\s*#.*\bnum_blocks=(\d+)", text, flags=re.MULTILINE)
    return int(match.group(1)) if match else None


def _groups_from_text(text: str, source: str) -> list[list[int]]:
    groups = []
    for lineno, line in enumerate(text.splitlines(), 1):
        tokens = line.split("#", 1)[0].replace(",", " ").split()
        if not tokens:
            continue
        try:
            groups.append([int(token) for token in tokens])
        except ValueError:
            raise InputError(f"{source}:{lineno}: not an integer block id: {line.strip()!r}") \
                from None
    return groups


def load_trace(path: str | Path) -> SwapTrace:
    path = Path(path)
    text = read_text(path)
    source, tier_blocks = str(path), None
    if text.lstrip().startswith(("[", "{")):
        try:
            groups = _groups_from_json(json.loads(text), source)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
    else:
        groups = _groups_from_text(text, source)
        tier_blocks = _capacity_from_comments(text)
    for group in groups:
        for block_id in group:
            if isinstance(block_id, bool) or not isinstance(block_id, int) or block_id < 0:
                raise InputError(f"{path}: block ids must be non-negative integers, "
                                 f"got {block_id!r}")
    groups = [group for group in groups if group]
    if not groups:
        raise InputError(f"{path}: the trace is empty")
    return SwapTrace(tuple(np.asarray(g, dtype=np.int64) for g in groups), source=f"file:{path}",
                     tier_blocks=tier_blocks or None)


def save_trace(trace: SwapTrace, path: str | Path) -> None:
    """Write the text format: one swap-out per line, capacity in a header comment."""
    path = Path(path)
    header = f"# hifc swap trace: source={trace.source}"
    header += f" num_blocks={trace.tier_blocks}\n" if trace.tier_blocks else "\n"
    try:
        path.write_text(header + "".join(" ".join(map(str, group.tolist())) + "\n"
                                for group in trace.swap_outs))
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
