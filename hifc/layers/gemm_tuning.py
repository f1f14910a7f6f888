"""Which matrix kernel runs each projection of more than 16 rows on CUDA, chosen by timing.

torch runs a product through the first algorithm of cuBLAS's heuristic (or of cuBLASLt's,
under that preference). For the shapes of decode and prompt steps that is often not the
fastest one (docs/RESULTS.md). ``tune`` times, for each projection shape of a model and each
row count the engine will run: torch's cuBLAS path, its cuBLASLt path and every candidate
cuBLASLt's heuristic offers (:mod:`hifc.layers.cublaslt`), each over the model's own weights
of that shape in one CUDA graph, back to back as a step runs them; it keeps the fastest where
it beats the path ``linear`` would take anyway by more than ``MARGIN``, and where its output
matches that path's. ``run`` then computes a product by the choice for its shape.

The choices are kept on disk (:mod:`hifc.layers.gemm_choices`): a later process of the same
shapes on the same kind of GPU and libraries takes them, each checked to run and to compute
the product before it serves, instead of timing again.

Row counts up to ``EXACT_ROWS`` (decode batches, each a CUDA graph's size) are tuned one by
one; larger ones by powers of two, each choice serving the products of more than half its rows
(a prompt step of 5,000 tokens takes the 8,192-row choice). Products of shapes or row counts
not tuned, or whose tensors are not contiguous and 256-byte aligned as the tuning's were, keep
``linear``'s own path. GEMMs of one device run on one stream at a time (the engine's step
stream), so the cuBLASLt workspace is one per device.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
from dataclasses import dataclass

import torch

from hifc.layers import cublaslt
from hifc.layers.gemm_choices import ChoiceFile

logger = logging.getLogger(__name__)

EXACT_ROWS = 128
MARGIN = 0.02  # a choice other than linear's own path must be this much faster
REPLAYS = 3  # timed runs of each candidate's calls in its graph (the fastest counts)
EXACT_CALLS = 16  # weights per timed graph up to EXACT_ROWS rows: many times the L2 cache
BUCKET_CALLS = 4  # past EXACT_ROWS rows (compute-bound products)
# Prompt steps of more rows keep torch's cuBLAS path (tuning them would take gigabytes).
MAX_PROMPT_ROWS = 8192

# A choice: torch's cuBLAS path, torch's cuBLASLt path, or a cuBLASLt algorithm record.
CUBLAS, CUBLASLT = "cublas", "cublaslt"
Choice = str | bytes

_chosen: dict[tuple, Choice] = {}
_outcomes: dict[tuple, "Tuned"] = {}  # how each choice was made (kept for later engines)


def rows_key(m: int) -> int:
    """The row count whose choice serves a product of m rows."""
    return m if m <= EXACT_ROWS else 1 << (m - 1).bit_length()


def prompt_rows(max_num_batched_tokens: int) -> list[int]:
    """The row counts that serve prompt steps of up to that many tokens (past EXACT_ROWS), at
    most MAX_PROMPT_ROWS: powers of two from 256."""
    top = min(max_num_batched_tokens, MAX_PROMPT_ROWS)
    return [1 << p for p in range(8, (top - 1).bit_length() + 1)]


def _key(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, device_index: int) -> tuple:
    return rows_key(m), n, k, dtype, bias, device_index


def clear() -> None:
    """Forget every choice (products take ``linear``'s own path again)."""
    _chosen.clear()
    _outcomes.clear()


def choices() -> dict[tuple, Choice]:
    """The choices made: (rows, n, k, dtype, bias, device index) -> choice."""
    return dict(_chosen)


def launch(choice: Choice, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor) -> torch.Tensor:
    """out <- x W^T (+ bias) by ``choice``: torch's paths write out as ``F.linear`` computes
    (the same kernels), a cuBLASLt algorithm through its plan."""
    if choice == CUBLAS or choice == CUBLASLT:
        with cublaslt.torch_preference(choice):
            if bias is None:
                return torch.mm(x, weight.t(), out=out)
            return torch.addmm(bias, x, weight.t(), out=out)
    m, k = x.shape
    plan = _plan(m, weight.shape[0], k, x.dtype, bias is not None, x.device.index)
    return plan.run(x, weight, bias, out, choice)


@functools.lru_cache(maxsize=1024)
def _plan(m: int, n: int, k: int, dtype: torch.dtype, bias: bool,
          device_index: int) -> cublaslt.MatmulPlan:
    return cublaslt.MatmulPlan(m, n, k, dtype, bias, device_index)


@functools.lru_cache(maxsize=4096)
def _runnable(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, device_index: int,
              algo: bytes) -> cublaslt.MatmulPlan | None:
    """The plan of this shape if ``algo`` (tuned at another row count maybe) can run it."""
    plan = _plan(m, n, k, dtype, bias, device_index)
    return plan if plan.supports(algo) else None


def run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x W^T (+ bias)`` by the choice for its shape; None where there is none (the caller
    takes its own path)."""
    if not _chosen or not x.is_cuda or x.dim() != 2:
        return None
    m, k = x.shape
    n = weight.shape[0]
    choice = _chosen.get(_key(m, n, k, x.dtype, bias is not None, x.device.index))
    if choice is None:
        return None
    if isinstance(choice, str):
        return launch(choice, x, weight, bias, torch.empty(m, n, dtype=x.dtype, device=x.device))
    if not (x.is_contiguous() and weight.is_contiguous()
            and cublaslt.alignment(x) == 256 and cublaslt.alignment(weight) == 256):
        return None
    plan = _runnable(m, n, k, x.dtype, bias is not None, x.device.index, choice)
    if plan is None:
        return None
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)  # 256-byte aligned
    return plan.run(x, weight, bias, out, choice)


@dataclass(frozen=True)
class Tuned:
    """One shape and row count's outcome (times in us per product)."""

    n: int
    k: int
    rows: int
    projections: int  # weights of this shape (timed: the first EXACT_CALLS or BUCKET_CALLS)
    candidates: int
    default: str  # linear's own path
    default_us: float
    chosen: str  # "cublas", "cublaslt" or "candidate i" of cuBLASLt's list
    chosen_us: float
    from_file: bool = False  # timed by an earlier process (its times), taken from its file


def fingerprint(device_index: int) -> dict:
    """What a choice made by timing depends on besides the shape: the GPU, the libraries and
    this tuning's parameters."""
    props = torch.cuda.get_device_properties(device_index)
    try:
        lt_version = cublaslt.version()
    except (cublaslt.CublasLtError, OSError, AttributeError):
        lt_version = None
    return {"gpu": props.name, "capability": [props.major, props.minor],
            "sms": props.multi_processor_count, "memory": props.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda, "cublaslt": lt_version,
            "tuning": [EXACT_ROWS, MARGIN, REPLAYS, EXACT_CALLS, BUCKET_CALLS, MAX_PROMPT_ROWS,
                       list(cublaslt.WORKSPACE_LIMITS), cublaslt.MAX_CANDIDATES]}


def choice_file(groups: dict[tuple[int, int, torch.dtype, bool], list]) -> ChoiceFile:
    """The file keeping the choices for these projection shapes (``tune``'s groups) on their
    device's kind of GPU."""
    device = next(iter(groups.values()))[0][0].device
    return ChoiceFile(fingerprint(device.index),
                      [[n, k, str(dtype), bias] for n, k, dtype, bias in groups])


def _record(choice: Choice, tuned: Tuned) -> dict:
    fields = dataclasses.asdict(tuned)
    del fields["from_file"]
    return {"choice": choice if isinstance(choice, str) else choice.hex(), **fields}


def _restore(record: dict | None, default: str, x: torch.Tensor,
             projection: tuple[torch.Tensor, torch.Tensor | None], out: torch.Tensor,
             ref: torch.Tensor) -> tuple[Choice, Tuned] | None:
    """A recorded choice, if it still applies: made against the same path of ``linear``,
    runnable at this shape (an algorithm record) and computing the product."""
    if record is None or record.get("default") != default:
        return None
    weight, bias = projection
    m, k = x.shape
    try:
        choice = record["choice"]
        if choice not in (CUBLAS, CUBLASLT):
            choice = bytes.fromhex(choice)
            if not _plan(m, weight.shape[0], k, x.dtype, bias is not None,
                         x.device.index).supports(choice):
                return None
        if not _close(launch(choice, x, weight, bias, out), ref):
            return None
        tuned = Tuned(**{field.name: record[field.name] for field in dataclasses.fields(Tuned)
                         if field.name != "from_file"}, from_file=True)
    except (KeyError, TypeError, ValueError, cublaslt.CublasLtError) as e:
        logger.warning("a recorded GEMM choice for %d rows of [%d, %d] not used: %r", m,
                       weight.shape[0], k, e)
        return None
    return choice, tuned


def graph_timing_supported() -> bool:
    """Whether torch records timing events inside a CUDA graph (``external`` events, torch
    2.8 and later), which the tuning's timing needs."""
    return "external" in inspect.signature(torch.cuda.Event.__new__).parameters


def _graph_us(calls, count: int) -> float:
    """The fastest of REPLAYS runs of ``calls``, back to back in one CUDA graph after an
    untimed one, per product. Events recorded inside the graph time each run: the device's
    own time, whatever this thread does meanwhile (start-up times the GEMMs while a pool of
    threads compiles kernels, which stalls this thread at times, so that an event it recorded
    after a replay could count a stall). The graph is captured directly (``torch.cuda.graph``
    would also collect garbage, empty the allocator's cache and synchronise at every
    candidate) and waited for once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    marks = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(REPLAYS + 1)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        calls()  # outside the capture: cuBLAS's lazy set-up
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            calls()
            marks[0].record()
            for mark in marks[1:]:
                calls()
                mark.record()
        finally:
            graph.capture_end()
        graph.replay()
    marks[-1].synchronize()
    torch.cuda.current_stream().wait_stream(stream)
    del graph
    return min(a.elapsed_time(b) for a, b in zip(marks, marks[1:])) * 1e3 / count


def _candidates(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, device_index: int,
                aligns: tuple[int, int, int]) -> list[bytes]:
    """cuBLASLt's candidates for a shape; none where cuBLASLt cannot be reached through ctypes
    (then only torch's two paths are timed)."""
    try:
        return _plan(m, n, k, dtype, bias, device_index).candidates(aligns)
    except (cublaslt.CublasLtError, OSError, AttributeError) as e:
        logger.warning("cuBLASLt's candidates are not available (%s): timing torch's paths "
                       "only", e)
        return []


def _close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether y is ref up to the rounding of another summation order (one synchronisation)."""
    scale = ref.abs().max()
    limit = 1e-2 * torch.where(scale > 0, scale, torch.ones_like(scale))
    return bool(((y.float() - ref).abs().max() <= limit).item())


def tune(groups: dict[tuple[int, int, torch.dtype, bool],
                      list[tuple[torch.Tensor, torch.Tensor | None]]],
         rows: list[int], default_for, store: ChoiceFile | None = None) -> list[Tuned]:
    """Choose the kernel of each shape's products at each row count (module doc).

    groups: (n, k, dtype, has bias) -> each projection's (weight, bias) of that shape, on one
    CUDA device; rows: the row counts to tune (a count past EXACT_ROWS tunes its power of
    two); default_for(m): linear's own path at m rows (CUBLAS or CUBLASLT); store: the file
    of choices to take (those that still apply) and to complete with the ones timed now. A
    shape and row count tuned before in this process keeps its choice (another engine of the
    same model)."""
    if not graph_timing_supported():
        logger.warning("the GEMM tuning needs torch 2.8 or later (timing events inside CUDA "
                       "graphs): projections take torch's paths")
        return []
    outcomes = []
    started = time.perf_counter()
    saved = store.read() if store is not None else {}
    records: dict = {}  # of this call's choices, for the store
    timed_now = 0
    for (n, k, dtype, has_bias), projections in groups.items():
        device = projections[0][0].device
        for m in sorted({rows_key(r) for r in rows}):
            key = _key(m, n, k, dtype, has_bias, device.index)
            entry = (m, n, k, str(dtype), has_bias)
            if key in _outcomes:
                outcomes.append(_outcomes[key])
                records[entry] = _record(_chosen[key], _outcomes[key])
                continue
            calls = projections[:EXACT_CALLS if m <= EXACT_ROWS else BUCKET_CALLS]
            x = torch.randn(m, k, dtype=dtype, device=device)
            out = torch.empty(m, n, dtype=dtype, device=device)
            default = default_for(m)
            ref = launch(default, x, calls[0][0], calls[0][1], out).float()
            restored = _restore(saved.get(entry), default, x, calls[0], out, ref)
            if restored is None:
                restored = _time(m, n, k, dtype, has_bias, calls, len(projections), default,
                                 x, out, ref)
                timed_now += 1
            choice, tuned = restored
            _chosen[key], _outcomes[key] = choice, tuned
            records[entry] = _record(choice, tuned)
            outcomes.append(tuned)
            del x, out
    kept = ""
    if store is not None:
        if timed_now:
            store.write({**saved, **records})
        kept = (f"; {sum(t.from_file for t in outcomes)} taken from {store.path}, "
                f"{timed_now} timed now")
    logger.info("tuned the projections' matrix kernels (%d shapes x %d row counts) in %.1f s; "
                "%d of %d take another kernel than torch's%s", len(groups),
                len({rows_key(r) for r in rows}), time.perf_counter() - started,
                sum(t.chosen != t.default for t in outcomes), len(outcomes), kept)
    return outcomes


def _time(m: int, n: int, k: int, dtype: torch.dtype, has_bias: bool,
          calls: list[tuple[torch.Tensor, torch.Tensor | None]], projections: int,
          default: str, x: torch.Tensor, out: torch.Tensor,
          ref: torch.Tensor) -> tuple[Choice, Tuned]:
    """Time linear's path and every candidate of one shape and row count over ``calls``, each
    checked against ``ref`` (the default's product of x and the first weight); the choice."""
    algos = _candidates(m, n, k, dtype, has_bias, x.device.index,
                        cublaslt.aligns_of(x, calls[0][0], out))
    options: list[Choice] = [CUBLAS, CUBLASLT, *algos]
    timed: dict[Choice, float] = {}
    for choice in options:
        try:
            if not _close(launch(choice, x, calls[0][0], calls[0][1], out), ref):
                logger.warning("kernel candidate for %s rows of [%d, %d] computes "
                               "another product; left out", m, n, k)
                continue
            timed[choice] = _graph_us(
                lambda c=choice: [launch(c, x, w, b, out) for w, b in calls], len(calls))
        except cublaslt.CublasLtError as e:
            logger.debug("cuBLASLt candidate left out: %s", e)
    best = min(timed, key=timed.get)
    choice = best if timed[best] < timed[default] * (1 - MARGIN) else default
    name = choice if isinstance(choice, str) else f"candidate {algos.index(choice)}"
    return choice, Tuned(n, k, m, projections, len(timed), default, timed[default], name,
                         timed[choice])
