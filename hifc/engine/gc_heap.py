"""Short full garbage collections while an engine serves (``frozen_heap``).

Python's collector now and then walks every container object in its oldest generation. After an
engine starts, that is mostly start-up state that lives as long as the engine: modules, the
model, compiled kernels, CUDA graphs, tokenizer tables. One such walk over a tiny preset's
start-up heap (about 300k objects) took 196 ms on a 2-core machine, and one that came in the
middle of a benchmark's serving stalled it 153 ms (docs/RESULTS.md): a whole stalled step, at
any batch. Frozen (``gc.freeze``), that state is out of the collector's reach and a full
collection walks only what the engine allocated since (5.6-8.4 ms in the same run). Frozen
objects are never collected, so the heap is unfrozen when the engine closes: this is for
processes that run one engine at a time (the server, a data-parallel replica, a
tensor-parallel worker rank, a benchmark's engine), not for code that builds engines freely.
``LLM.generate`` freezes the heap for the length of one call, without the collection first
(that would cost each call a walk of the whole heap): garbage that exists when the call starts
waits for the call's end. A block inside another's freeze leaves the heap as it finds it.

Whether a block is open is this module's own count, not ``gc.get_freeze_count()``: a library
may freeze a few objects of its own while the interpreter starts (one on the GPU machine froze
375), and taking that for an enclosing block left the whole start-up heap in the collector's
reach (a full collection of 150-220 ms every two seconds in an 8B engine's serving process,
docs/RESULTS.md). Python keeps one permanent generation, so the end of the outermost block
unfreezes such objects too.

The block also raises the young generation's threshold (``YOUNG_THRESHOLD``). Python collects
that generation whenever the count of container objects allocated and not yet freed passes 700.
A step of a busy engine allocates and frees thousands (outputs, deltas, queue messages,
scheduler lists): at 700 the young generation was collected about three times per step in an
8B engine process serving 256 requests (1,539 collections in 530 steps on the GPU machine),
though reference counting frees nearly all of those objects within the step. Above a step's
churn, a young collection comes only when live objects really pile up.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

_open_blocks = 0  # frozen_heap blocks running in this process
YOUNG_THRESHOLD = 20_000  # the young generation's threshold inside a block (Python's: 700)


@contextlib.contextmanager
def frozen_heap(collect: bool = True) -> Iterator[None]:
    """Collect (with ``collect``), then freeze every object that exists now for the block's
    duration (start it once the engine has started), with the young generation's threshold
    raised; unfreeze and restore the threshold after, so that a closed engine can be collected.
    Inside another block, the heap stays as that block keeps it."""
    global _open_blocks
    if _open_blocks:
        yield
        return
    start = time.perf_counter()
    if collect:
        gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    logger.debug("froze %d objects out of the garbage collector's reach (%.0f ms)",
                 gc.get_freeze_count(), 1000 * (time.perf_counter() - start))
    _open_blocks += 1
    try:
        yield
    finally:
        _open_blocks -= 1
        gc.set_threshold(*thresholds)
        gc.unfreeze()
