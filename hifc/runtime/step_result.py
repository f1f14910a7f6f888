"""A launched step: its work is queued on the device, its results are on their way to the host.

``ModelRunner.launch_forward`` and ``launch_sampling`` queue a step (inputs, forward, sampling)
and return a :class:`LaunchedStep` at once. The sampled ids (with the logprobs, if asked for)
and the prompt logprobs are copied to the host without blocking; :meth:`LaunchedStep.result`
waits for those copies alone (an event after them), so the host may prepare and launch the next
step first. Sampled ids without logprobs reach the host through a kernel that writes them into
:class:`HostSlots` (``triton_host_io.store_to_host``), not through the copy engine. The sampled
ids also stay on the device (:class:`DeviceTokens`): the next step's decodes read their pending
input tokens there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hifc.core.outputs import PromptLogprobs, SamplerOutput, TopLogprobs
from hifc.layers import triton_host_io
from hifc.layers.sampler import SampledTokens


@dataclass(frozen=True)
class DeviceTokens:
    """The ids a launched step sampled, on the device (token_ids [S] long), and the row of each
    sequence that sampled in it."""

    token_ids: torch.Tensor
    rows: dict[str, int]


@dataclass(frozen=True)
class PromptLogprobsPart:
    """One row's prompt logprobs on the device: the prompt tokens at positions ``start``.. and
    the tensors of ``sampling_ops.top_logprobs`` for them."""

    row: int
    start: int
    token_ids: list[int]
    values: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class HostSlots:
    """Pinned host buffers of ``rows`` ids each that steps' sampled ids are written into, one
    step after another in turn: a step's ids stay there until ``count`` later steps have been
    stored (the engine reads a step's results before it launches the step after the next)."""

    def __init__(self, rows: int, count: int = 4):
        self.rows, self.count = rows, count
        self._buffers = [torch.zeros(rows, dtype=torch.long, pin_memory=True)
                         for _ in range(count)]
        self._stored = 0  # steps stored so far

    def store(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, int] | None:
        """Queue the write of ``token_ids`` ([S] long, on the device) into the next buffer:
        (the host view, its store's number), or None if S exceeds ``rows``."""
        if token_ids.numel() > self.rows:
            return None
        number, self._stored = self._stored, self._stored + 1
        return (triton_host_io.store_to_host(token_ids.contiguous(),
                                             self._buffers[number % self.count]), number)

    def check(self, number: int) -> None:
        """Raise if the buffer of store ``number`` has been handed to a later step since."""
        if self._stored > number + self.count:
            raise RuntimeError(f"a step's sampled ids were read after {self._stored - number - 1} "
                               f"later steps, when the host keeps the last {self.count}")


class LaunchedStep:
    def __init__(self, device: torch.device, sampled: SampledTokens | None = None,
                 prompt_parts: list[PromptLogprobsPart] = (), slots: HostSlots | None = None):
        self._sampled = _pack(sampled) if sampled is not None else None
        self._logprobs_k = (sampled.top_ids.shape[1]
                            if sampled is not None and sampled.logprobs is not None else None)
        self._prompt_parts = list(prompt_parts)
        self._prompt = [_pack_prompt(p.values) for p in self._prompt_parts]
        self._ready = None
        self._slots, self._slot = None, 0
        if device.type == "cuda":
            stored = (slots.store(self._sampled) if slots is not None and self._sampled is not None
                      and self._logprobs_k is None else None)
            if stored is None:
                self._sampled = _to_host(self._sampled)
            else:
                (self._sampled, self._slot), self._slots = stored, slots
            self._prompt = [_to_host(t) for t in self._prompt]
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(device))

    def result(self) -> SamplerOutput:
        """Wait for the step's results to reach the host; the ids sampled (in the order of
        ``SchedulerOutput.sampling``), their logprobs and the prompt logprobs."""
        if self._ready is not None:
            self._ready.synchronize()
        if self._slots is not None:
            self._slots.check(self._slot)
        out = (SamplerOutput([]) if self._sampled is None
               else _unpack(self._sampled.tolist(), self._logprobs_k))
        for part, values in zip(self._prompt_parts, self._prompt):
            out.prompt_logprobs[part.row] = PromptLogprobs(
                part.start, _unpack_prompt(part.token_ids, values.tolist()))
        return out


def _to_host(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Start copying ``tensor`` into pinned host memory (valid once the step's event is): into
    pageable memory the copy would make the host wait for the device."""
    if tensor is None:
        return None
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _pack(sampled: SampledTokens) -> torch.Tensor:
    """The step's results in one tensor: ids [S] long, or with logprobs ids, ranks, top ids,
    chosen logprob and top logprobs side by side as float64 [S, 3 + 2k] (exact for ids and
    ranks, and for float32 logprobs)."""
    if sampled.logprobs is None:
        return sampled.token_ids
    return torch.cat([sampled.token_ids[:, None], sampled.ranks[:, None], sampled.top_ids,
                      sampled.logprobs[:, None], sampled.top_logprobs],
                     dim=1).to(torch.float64)


def _unpack(rows: list, k: int | None) -> SamplerOutput:
    if k is None:
        return SamplerOutput(rows)
    token_ids = [int(row[0]) for row in rows]
    return SamplerOutput(token_ids, TopLogprobs(
        token_ids, [row[2 + k] for row in rows], [int(row[1]) for row in rows],
        [[int(t) for t in row[2:2 + k]] for row in rows], [row[3 + k:] for row in rows]))


def _pack_prompt(values: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """chosen [C], ranks [C], top ids [C, k], top logprobs [C, k] -> float64 [C, 2 + 2k]."""
    chosen, ranks, top_ids, top_lp = values
    return torch.cat([chosen[:, None].to(torch.float64), ranks[:, None].to(torch.float64),
                      top_ids.to(torch.float64), top_lp.to(torch.float64)], dim=1)


def _unpack_prompt(token_ids: list[int], rows: list[list[float]]) -> TopLogprobs:
    k = (len(rows[0]) - 2) // 2 if rows else 0
    return TopLogprobs(token_ids, [row[0] for row in rows], [int(row[1]) for row in rows],
                       [[int(t) for t in row[2:2 + k]] for row in rows],
                       [row[2 + k:] for row in rows])
