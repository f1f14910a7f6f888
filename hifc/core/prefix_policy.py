"""Read or recompute: how many of a request's blocks found in the flash prefix store to read.

Reading ``n`` blocks moves ``n * block_bytes`` from the tier at its measured read bandwidth
(completed swap-ins and prefix reads: bytes over submission-to-I/O-end seconds, so queueing and
fixed latency count against the disk); recomputing them prefills ``n * block_size`` tokens at
the measured prefill speed (the engine's prefill steps, as for ``preemption=auto``). Both costs
grow linearly in ``n``, so the rule reads all the blocks found or none: read when
``block_bytes / read_bandwidth <= block_size / prefill_speed``.

Until both rates are measured, reading is assumed worth it (as ``preemption=auto`` assumes
swapping is): the first reads measure the disk, and from then on a disk slower than prefill is
not read. What a wrong first guess costs is bounded by the reads admitted before the first one
completes (a few requests' time to first token, once per engine). ``always`` reads every block
found (tests, benchmarks of the read path).
"""
from __future__ import annotations

from hifc.core.preemption import RateMeter
from hifc.options import check_choice
from hifc.tiers.config import PREFIX_STORE_READ


class PrefixReadPolicy:
    def __init__(self, mode: str, block_bytes: int, block_size: int, prefill_speed: RateMeter,
                 read_bandwidth: RateMeter | None = None):
        check_choice("prefix_store_read", mode, PREFIX_STORE_READ)
        self.mode = mode
        self.block_bytes = block_bytes
        self.block_size = block_size
        self.prefill_speed = prefill_speed  # tokens/s, shared with the preemption policy
        self.read_bandwidth = read_bandwidth or RateMeter()  # bytes/s of tier reads

    def reading_pays(self) -> bool:
        """Whether reading a block costs less time than recomputing it (see the module doc)."""
        if self.mode == "always":
            return True
        bandwidth, speed = self.read_bandwidth.rate, self.prefill_speed.rate
        if bandwidth is None or speed is None:
            return True
        return self.block_bytes / bandwidth <= self.block_size / speed

    def blocks_to_read(self, num_found: int) -> int:
        """Of ``num_found`` leading blocks found in the store, how many to read."""
        return num_found if num_found > 0 and self.reading_pays() else 0
