"""A model-based fuzz of the flash tier: random interleavings of swap records and prefix
records in the one log, holds, jobs left in flight, restarts, injected I/O faults and bytes
flipped on disk, checked against what was written.

What must hold in every run:
- whatever reaches a KV cache is bit for bit what was stored under that owner or hash;
- a job fails only where an injected fault hit while it ran, or a block it covers is damaged
  (a byte flipped, or the last write to it failed); a prefix read that fails is INTEGRITY or
  the fault's error, and never touches a block past the chain it found;
- a completed prefix write is found at once; across a restart, every record survives unless
  its block is damaged, and a record that appears was written at some time (content-addressed,
  so a read of it is still checked against the content);
- a held record is never handed to a swap; once every swap is freed and every hold released,
  every block is reservable again.
"""
import hashlib
import random

import pytest
import torch

from hifc.dtypes import torch_dtype
from hifc.tiers import ErrorKind, KVGeometry, TierConfig, make_tier
from hifc.tiers.flash.layout import LAYOUTS
from hifc.tiers.flash.prefix_index import key_of
from tests.tiers.tier_helpers import flip_byte, same_bytes

GPU_BLOCKS = 6
STEPS = 120
SALTS = (hashlib.sha256(b"model A").digest(), hashlib.sha256(b"model B").digest())
HASHES = tuple(hashlib.sha256(f"block {i}".encode()).digest() for i in range(16))
GEOMETRIES = (KVGeometry(2, 2, 32, 16, "float16"), KVGeometry(3, 1, 5, 3, "bfloat16"))
OPS = {"prefix_write": 6, "prefix_read": 6, "lookup": 3, "swap_out": 4, "swap_in": 4,
       "free": 1, "hold": 2, "release": 2, "wait": 2, "restart": 1, "flip_byte": 1,
       "arm_fault": 1}


class TierRun:
    """One random run against one cache file, with the model it is checked against."""

    def __init__(self, seed: int, path: str):
        self.rng = random.Random(seed)
        self.geometry = self.rng.choice(GEOMETRIES)
        self.layout = self.rng.choice(LAYOUTS)
        self.policy = self.rng.choice(("append", "left-append"))
        self.num_blocks = self.rng.randint(4, 14)
        self.path = path
        g = self.geometry
        self.shape = (g.num_layers, 2, GPU_BLOCKS, g.block_size, g.num_kv_heads, g.head_dim)
        self.dtype = torch_dtype(g.dtype)
        self.gen = torch.Generator().manual_seed(seed)
        self.content = {}  # (salt, hash) -> the block it names
        self.written = set()  # (salt, hash) of every prefix write submitted
        self.swaps = []  # (tier blocks, owner, their blocks as swapped out)
        self.holds = []
        self.in_flight = []  # (job, check, fault hits when submitted)
        self.damaged = set()  # tier blocks with a flipped byte or a failed write since
        self.owners = 0
        self.tier = self.open()

    def open(self):
        config = TierConfig(kv_offload="flash", flash_path=self.path,
                            num_tier_blocks=self.num_blocks, prefix_store="evicted",
                            flash_layout=self.layout, flash_policy=self.policy,
                            tier_fault_injection=True)
        return make_tier(config, self.geometry)

    def block(self, salt, block_hash):
        key = (salt, block_hash)
        if key not in self.content:
            self.content[key] = torch.randn(self.shape[:2] + self.shape[3:],
                                            generator=self.gen).to(self.dtype)
        return self.content[key]

    def run(self):
        names, weights = zip(*OPS.items())
        for _ in range(STEPS):
            getattr(self, self.rng.choices(names, weights)[0])()
            self.check_accounting()
        self.wait()
        for handle in self.holds:
            self.tier.release_prefix(handle)
        for blocks, _, _ in self.swaps:
            self.tier.free(blocks)
        assert self.tier.num_free_blocks == self.num_blocks
        self.tier.close()

    # -- jobs, waited for now or later ---------------------------------------------------------
    def submit(self, job, check, hits):
        """``hits``: the fault hits before ``job`` was submitted (its I/O may start at once)."""
        entry = (job, check, hits)
        if self.rng.random() < 0.5:
            self.finish(*entry)
        else:
            self.in_flight.append(entry)

    def finish(self, job, check, hits):
        self.tier.wait(job)
        check(job, self.tier.faults.hits != hits)

    def wait(self):
        while self.in_flight:
            self.finish(*self.in_flight.pop(0))

    # -- prefix records --------------------------------------------------------------------------
    def prefix_write(self):
        salt, k = self.rng.choice(SALTS), self.rng.randint(1, 4)
        hashes = self.rng.sample(HASHES, k)
        gpu_blocks = self.rng.sample(range(GPU_BLOCKS), k)
        kv = torch.zeros(self.shape, dtype=self.dtype)
        for g, h in zip(gpu_blocks, hashes):
            kv[:, :, g] = self.block(salt, h)
        hits = self.tier.faults.hits
        job = self.tier.submit_prefix_write(kv, list(zip(gpu_blocks, hashes)), salt)
        self.written.update((salt, h) for h in job.hashes)

        def check(job, fault_hit):
            if job.ok:
                assert all(self.tier.lookup_prefix([h], salt, count=False) == 1
                           for h in job.hashes), "a block just written is not found"
                self.damaged.difference_update(b for _, b in job.pairs)
            else:
                assert fault_hit, job.error
                self.damaged.update(b for _, b in job.pairs)
        self.submit(job, check, hits)

    def prefix_read(self, lookup_only=False):
        salt, k = self.rng.choice(SALTS), self.rng.randint(1, 5)
        hashes = self.rng.sample(HASHES, k)
        found = self.tier.lookup_prefix(hashes, salt)
        if lookup_only:
            return
        back = torch.full(self.shape, 3.0, dtype=self.dtype)
        hits = self.tier.faults.hits
        job = self.tier.submit_prefix_read(back, list(zip(hashes, range(k))), salt)
        assert len(job.pairs) == found
        blocks = [b for b, _ in job.pairs]

        def check(job, fault_hit):
            for i in range(job.blocks_ok):
                assert same_bytes(back[:, :, i], self.block(salt, hashes[i])), "wrong KV"
            assert (back[:, :, found:] == 3.0).all(), "a read wrote past the chain it found"
            if job.ok:
                assert job.blocks_ok == found
            else:
                assert fault_hit or job.error_kind is ErrorKind.INTEGRITY, job.error
                assert fault_hit or any(b in self.damaged for b in blocks), job.error
        self.submit(job, check, hits)

    def lookup(self):
        self.prefix_read(lookup_only=True)

    def hold(self):
        salt = self.rng.choice(SALTS)
        self.holds.append(self.tier.hold_prefix(self.rng.sample(HASHES, 3), salt))

    def release(self):
        if self.holds:
            self.tier.release_prefix(self.holds.pop(self.rng.randrange(len(self.holds))))

    # -- swap records ----------------------------------------------------------------------------
    def swap_out(self):
        k = self.rng.randint(1, 3)
        if not self.tier.can_reserve(k):
            return
        kv = torch.randn(self.shape, generator=self.gen).to(self.dtype)
        gpu_blocks = self.rng.sample(range(GPU_BLOCKS), k)
        self.owners += 1
        owner = (self.owners, self.rng.randint(0, 3))
        hits = self.tier.faults.hits
        job = self.tier.wait(self.tier.swap_out_blocks(kv, gpu_blocks, owner=owner))
        if job.ok:
            self.damaged.difference_update(job.tier_blocks)
            self.swaps.append((list(job.tier_blocks), owner, kv[:, :, gpu_blocks].clone()))
        else:
            assert self.tier.faults.hits != hits, job.error
            self.damaged.update(job.tier_blocks)
            self.tier.free(job.tier_blocks)

    def swap_in(self):
        if not self.swaps:
            return
        blocks, owner, expected = self.swaps.pop(self.rng.randrange(len(self.swaps)))
        back = torch.zeros_like(expected)
        hits = self.tier.faults.hits
        job = self.tier.wait(self.tier.submit_swap_in(
            back, list(zip(blocks, range(len(blocks)))), owner))
        if job.ok:
            assert same_bytes(back, expected), "wrong KV"
        else:
            assert self.tier.faults.hits != hits or self.damaged & set(blocks), job.error
        self.tier.free(blocks)

    def free(self):
        if self.swaps:
            self.tier.free(self.swaps.pop(self.rng.randrange(len(self.swaps)))[0])

    # -- restarts and damage ---------------------------------------------------------------------
    def restart(self):
        self.wait()
        index = self.tier.prefix.index
        before = {(s, h): index.block_of(key_of(s, h)) for s in SALTS for h in HASHES}
        self.tier.close()
        self.tier = self.open()
        self.swaps.clear()  # swap records belong to the run that wrote them
        self.holds.clear()
        index = self.tier.prefix.index
        for (s, h), block in before.items():
            now = index.block_of(key_of(s, h))
            if block is not None and now is None:
                assert block in self.damaged, "a stored record was lost at a restart"
            if block is None and now is not None:
                assert (s, h) in self.written, "a record never written appeared"

    def flip_byte(self):
        self.wait()
        layout, block = self.tier.layout, self.rng.randrange(self.num_blocks)
        if self.rng.random() < 0.5:
            offset = layout.header_file_offset(block) + self.rng.randrange(64)
        else:
            offset = layout.data_file_offset(self.rng.randrange(self.geometry.num_layers),
                                             self.rng.randrange(2), block)
            offset += self.rng.randrange(self.geometry.slice_bytes)
        flip_byte(self.path, offset, mask=0x10)
        self.damaged.add(block)

    def arm_fault(self):
        faults, skip = self.tier.faults, self.rng.randint(0, 2)
        if self.rng.random() < 0.5:
            faults.arm("write", self.rng.choice(("eio", "enospc")), skip=skip)
        else:
            effect = self.rng.choice(("eio", "short", "bitflip"))
            faults.arm("read", effect, skip=skip,
                       byte_offset=self.rng.randrange(4096) if effect == "bitflip" else 0)

    def check_accounting(self):
        held = {b for handle in self.holds for b in handle}
        swapped = {b for blocks, _, _ in self.swaps for b in blocks}
        assert not held & swapped, "a held prefix record was handed to a swap"
        assert self.tier.num_free_blocks <= self.num_blocks - len(swapped)


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_never_return_wrong_kv(tmp_path, seed):
    TierRun(seed, str(tmp_path / "cache.kvc")).run()
