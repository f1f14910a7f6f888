"""Tier jobs: what ``submit_swap_out``/``submit_swap_in`` (and the flash tier's
``submit_prefix_write``/``submit_prefix_read``) return and ``poll``/``wait`` report."""
from __future__ import annotations

import enum
import errno as errno_mod
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

WRITES = ("swap_out", "prefix_write")  # ops whose pairs are (GPU block, tier block)


class JobStatus(enum.Enum):
    PENDING = "pending"
    OK = "ok"
    FAILED = "failed"


class ErrorKind(enum.Enum):
    IO_ERROR = "io_error"  # EIO and other OS errors
    NO_SPACE = "no_space"  # ENOSPC from the file system
    SHORT_READ = "short_read"
    INTEGRITY = "integrity"  # bad magic/epoch/block id/owner/checksum: stale, torn or corrupt
    TIER_FULL = "tier_full"  # not enough free tier blocks
    BUSY = "busy"  # a block still has I/O in flight
    INTERNAL = "internal"  # an unexpected exception inside the tier (a bug; still not raised)
    CANCELLED = "cancelled"  # the tier closed before this work started (prefix jobs only)


class ShortReadError(OSError):
    pass


class IntegrityError(Exception):
    """A stored record failed verification (stale, torn or corrupted)."""


class JobCancelled(Exception):
    """Work not started before the tier closed."""


def _checked_u64(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 64:
        raise ValueError(f"{name} must be an int in [0, 2**64), got {value!r}")
    return value


def check_owner(owner) -> tuple[int, int]:
    """Validate an owner ``(seq_id, generation)`` pair."""
    if not isinstance(owner, (tuple, list)) or len(owner) != 2:
        raise ValueError(f"owner must be a (seq_id, generation) pair, got {owner!r}")
    return _checked_u64("owner seq_id", owner[0]), _checked_u64("owner generation", owner[1])


@dataclass(eq=False)
class Job:
    """One asynchronous swap. Fields are written by the tier only.

    ``pairs`` are (src, dst) ids: (GPU block, tier block) for swap-out, (tier block, GPU block)
    for swap-in. ``status`` is PENDING until ``poll``/``wait`` reports the job; then ``ok`` or
    ``error``/``error_kind``/``errno`` say how it ended. ``nbytes`` counts KV payload moved.
    """

    job_id: int
    op: str  # "swap_out" | "swap_in"
    pairs: tuple[tuple[int, int], ...]
    owner: tuple[int, int]
    status: JobStatus = JobStatus.PENDING
    error: str | None = None
    error_kind: ErrorKind | None = None
    errno: int | None = None
    nbytes: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    finished_at: float | None = None  # when poll/wait reported the job
    io_done_at: float | None = None  # when its last piece of I/O completed (worker clock)
    _futures: list[Future] = field(default_factory=list, repr=False)
    _pinned: tuple[int, ...] = field(default=(), repr=False)  # tier blocks held in flight
    # swap-out: indices of pairs whose source blocks this rank's workers have copied out of
    # the KV cache, and those of them the engine has taken (``KVTier.take_staged``)
    _staged: set[int] = field(default_factory=set, repr=False)
    _taken: set[int] = field(default_factory=set, repr=False)

    @property
    def done(self) -> bool:
        return self.status is not JobStatus.PENDING

    @property
    def ok(self) -> bool:
        return self.status is JobStatus.OK

    @property
    def tier_blocks(self) -> list[int]:
        return [dst for _, dst in self.pairs] if self.op in WRITES else \
            [src for src, _ in self.pairs]

    @property
    def latency_s(self) -> float | None:
        """Submission to the end of the I/O (not to the poll that noticed it)."""
        end = self.io_done_at if self.io_done_at is not None else self.finished_at
        return None if end is None else end - self.submitted_at

    def note_io_done(self, _future: Future | None = None) -> None:
        """Future callback (worker thread): remember when the last piece finished."""
        self.io_done_at = time.perf_counter()

    def fail(self, kind: ErrorKind, message: str, code: int | None = None) -> None:
        if self.error is None:  # keep the first error
            self.error, self.error_kind, self.errno = message, kind, code
        self.status = JobStatus.FAILED


def classify(exc: BaseException) -> tuple[ErrorKind, str, int | None]:
    """Map an exception raised inside an I/O task to (kind, message, errno)."""
    if isinstance(exc, IntegrityError):
        return ErrorKind.INTEGRITY, str(exc), None
    if isinstance(exc, JobCancelled):
        return ErrorKind.CANCELLED, str(exc), None
    if isinstance(exc, ShortReadError):
        return ErrorKind.SHORT_READ, exc.strerror or str(exc), exc.errno
    if isinstance(exc, OSError):
        kind = ErrorKind.NO_SPACE if exc.errno == errno_mod.ENOSPC else ErrorKind.IO_ERROR
        name = errno_mod.errorcode.get(exc.errno or 0, "OSError")
        return kind, f"{name}: {exc.strerror or exc}", exc.errno
    return ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}", None


@dataclass(eq=False)
class PrefixJob(Job):
    """A flash prefix-store write or read (``op`` "prefix_write" or "prefix_read").

    ``pairs`` are (GPU block, tier block) for a write and (tier block, GPU block) for a read, and
    ``hashes[i]`` is the content hash of ``pairs[i]``; ``requested`` counts the blocks the caller
    asked for. A write covers the asked blocks that were not already stored (or being written)
    and fit; ``skipped`` counts the others. A read covers the leading asked hashes still stored
    when it was submitted. Once done, ``blocks_ok`` is, for a write, how many blocks were
    published (findable by ``lookup_prefix``), and for a read, how many *leading* asked blocks
    now hold verified KV in the cache (use those, recompute from there on). ``owner`` is unused
    (0, 0).
    """

    salt: bytes = b""
    hashes: tuple[bytes, ...] = ()
    requested: int = 0
    skipped: int = 0
    blocks_ok: int = 0
    _done: bytearray = field(default_factory=bytearray, repr=False)  # per pair: 1 = written
    # (write) or verified and copied into the KV cache (read), set by the tier's workers


@dataclass(frozen=True)
class IOOrder:
    """A job's I/O as every tensor-parallel rank runs it on its own shard of the KV blocks
    (pairs and stamps as in the job; ``owner`` for swaps, ``salt``/``hashes`` for prefix
    jobs)."""

    job_id: int
    op: str
    pairs: tuple[tuple[int, int], ...]
    owner: tuple[int, int] = (0, 0)
    salt: bytes = b""
    hashes: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class RankOutcome:
    """How one job ended on one rank: bytes moved, the first error as (kind, message, errno)
    or None, and for a prefix job, per pair, 1 where the block was written or delivered."""

    rank: int
    job_id: int
    nbytes: int
    error: tuple[ErrorKind, str, int | None] | None = None
    done: bytes = b""


@dataclass(frozen=True)
class RankReport:
    """A worker rank's answer: the jobs that ended since its last answer, and for swap-outs
    still writing, the pairs (indices into the order's pairs) whose blocks it has staged since
    then (copied out of its KV shard)."""

    outcomes: list[RankOutcome]
    staged: dict[int, list[int]]
