"""``DramTier``: the baseline the paper compares with, vLLM-style swap space in host DRAM.

One block-major tensor ``[num_blocks, num_layers, 2, block_size, kv_heads, head_dim]`` per rank
(a tier block is one contiguous record), pinned when the KV cache is on a GPU, zero-filled at
start as vLLM does (that allocation time grows with the size, the paper's Table 6). A swap
gathers the blocks on the device into a contiguous block-major buffer, then moves each run of
consecutive tier blocks with one pinned DMA copy (and the reverse for swap-in), on the mover's
thread and its own CUDA stream; the job interface, reservation and statistics are the same as
the flash tier's. DRAM is not torn or stale, so no records or checksums are kept.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time

import torch

from hifc.dtypes import copy_dtype
from hifc.tiers.geometry import KVGeometry, runs_of
from hifc.tiers.mover import SWAP_OUT, TierMover
from hifc.tiers.tier import KVTier, TierPeers


class DramMover(TierMover):
    """One rank's pool of DRAM blocks and the thread that copies to and from it."""

    kind = "dram"

    def __init__(self, geometry: KVGeometry, num_blocks: int, *, device="cpu",
                 pin: bool | None = None):
        g = geometry
        pin = torch.device(device).type == "cuda" if pin is None else pin
        if pin and not torch.cuda.is_available():
            raise ValueError("a pinned DRAM tier needs CUDA")
        self.geometry = geometry
        start = time.perf_counter()
        self.pool = torch.zeros((num_blocks, g.num_layers, 2, g.block_size, g.num_kv_heads,
                                 g.head_dim), dtype=copy_dtype(g.dtype), pin_memory=pin)
        self.init_seconds = time.perf_counter() - start
        self.pinned = pin
        self._threads = cf.ThreadPoolExecutor(1, thread_name_prefix="hifc-dram-io")
        self._local = threading.local()

    def _stream(self, device: torch.device):
        if device.type != "cuda":
            return None
        stream = getattr(self._local, "stream", None)
        if stream is None or stream.device != device:
            stream = self._local.stream = torch.cuda.Stream(device)
        return stream

    def _copy(self, op: str, kv: torch.Tensor, pairs, ready) -> int:
        stream = self._stream(kv.device)
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        kv_ids = [p[0] for p in pairs] if op == SWAP_OUT else [p[1] for p in pairs]
        tier_ids = [p[1] for p in pairs] if op == SWAP_OUT else [p[0] for p in pairs]
        index = torch.tensor(kv_ids, dtype=torch.long, device=kv.device)
        with ctx:
            if ready is not None:
                stream.wait_event(ready)
            if op == SWAP_OUT:
                staged = kv.index_select(2, index).permute(2, 0, 1, 3, 4, 5).contiguous()
                for start, i, n in runs_of(tier_ids):  # [n, L, 2, bs, H, D] per run
                    self.pool[start:start + n].copy_(staged[i:i + n], non_blocking=True)
            else:
                staged = torch.empty((len(pairs), *self.pool.shape[1:]), dtype=kv.dtype,
                                     device=kv.device)
                for start, i, n in runs_of(tier_ids):
                    staged[i:i + n].copy_(self.pool[start:start + n], non_blocking=True)
                kv.index_copy_(2, index, staged.permute(1, 2, 0, 3, 4, 5))
        if stream is not None:
            stream.synchronize()
        return len(pairs) * self.geometry.block_bytes

    def launch(self, op, kv_cache, pairs, owner, ready, staged=None) -> list[cf.Future]:
        # the copy into the pool ends the job: nothing is staged before it
        return [self._threads.submit(self._copy, op, kv_cache, pairs, ready)]

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        self.pool = None

    def stats(self) -> dict:
        pool_bytes = 0 if self.pool is None else self.pool.numel() * self.pool.element_size()
        return {"pinned": self.pinned, "pool_bytes": pool_bytes,
                "init_seconds": self.init_seconds}


class DramTier(KVTier):
    kind = "dram"

    def __init__(self, geometry: KVGeometry, num_blocks: int, *, policy: str = "append",
                 device="cpu", pin: bool | None = None, peers: TierPeers | None = None):
        super().__init__(geometry, num_blocks, policy,
                         DramMover(geometry, num_blocks, device=device, pin=pin), peers)
