"""What the data-parallel front end and its replica processes send each other (pickled through
``multiprocessing`` queues).

Front end -> replica: ``AddRequest``, ``AbortRequests``, ``Stop``. Replica -> front end:
``Ready`` (or ``Failed``) once its engine is built, ``Outputs`` after each step that advanced a
request or left the replica idle, ``Closed`` when it stopped, ``Failed`` if its loop failed.
Outputs travel as deltas: the new token ids and the text change since the last message, so a
step costs the same to send at any sequence length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from hifc.engine.limits import ResolvedLimits
from hifc.loader.tokenizer import Tokenizer
from hifc.models.config import ModelArchConfig
from hifc.sampling_params import SamplingParams


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt: str | None  # the text, if given as text (reported back in outputs)
    prompt_ids: list[int]  # validated by the front end
    params: SamplingParams


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class ReplicaInfo:
    model_name: str
    arch: ModelArchConfig
    tokenizer: Tokenizer | None
    limits: ResolvedLimits
    device: str
    flash_path: str | None


@dataclass(frozen=True)
class Ready:
    replica: int
    info: ReplicaInfo
    stats: dict[str, Any]  # the replica engine's stats at start


@dataclass(frozen=True)
class Failed:
    replica: int
    kind: str  # the exception's class name
    message: str
    traceback: str


class OutputDelta(NamedTuple):
    """One request's progress since the replica's previous message: ``text`` becomes
    ``text[:text_keep] + text_append`` (a stop string can cut text already sent)."""

    request_id: str
    new_token_ids: list[int]
    text_keep: int
    text_append: str
    finish_reason: str | None
    finished: bool
    num_cached_tokens: int | None  # prompt tokens found in the replica's prefix cache


@dataclass(frozen=True)
class Outputs:
    replica: int
    deltas: list[OutputDelta]
    stats: dict[str, Any]  # the replica engine's stats after the step


@dataclass(frozen=True)
class Closed:
    replica: int
    stats: dict[str, Any]
