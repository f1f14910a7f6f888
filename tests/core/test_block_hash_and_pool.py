"""Block hashes (the format a persistent store must match) and the block pool: reference
counts, the hash map, and the LRU order in which free cached blocks are evicted."""
import hashlib
import struct

import pytest

from hifc.core.block_hash import BLOCK_HASH_BYTES, chain_block_hashes, hash_block
from hifc.core.block_pool import BlockPool

SALT = bytes(range(32))


def test_block_hash_is_blake2b_of_parent_and_little_endian_uint32_tokens():
    tokens = [1, 2, 70000, 2 ** 32 - 1]
    expected = hashlib.blake2b(SALT + struct.pack("<4I", *tokens), digest_size=32).digest()
    assert hash_block(SALT, tokens) == expected and len(expected) == BLOCK_HASH_BYTES
    assert hash_block(SALT, tokens) == hash_block(bytes(SALT), list(tokens))  # deterministic


def test_hashes_chain_over_full_blocks_from_the_salt():
    tokens = list(range(40))
    hashes = chain_block_hashes(SALT, tokens, 16)
    assert len(hashes) == 2  # the trailing 8 tokens form no full block
    assert hashes[0] == hash_block(SALT, tokens[:16])
    assert hashes[1] == hash_block(hashes[0], tokens[16:32])
    assert chain_block_hashes(hashes[0], tokens[16:40], 16) == hashes[1:]  # resumable
    changed_first = [99] + tokens[1:]
    assert chain_block_hashes(SALT, changed_first, 16)[1] != hashes[1]  # names the prefix
    assert chain_block_hashes(bytes(32), tokens, 16)[0] != hashes[0]  # the salt enters


@pytest.mark.parametrize("parent,tokens,message", [
    (b"short", [1], "32 bytes"), (SALT, [-1], "token ids"), (SALT, [2 ** 32], "token ids")])
def test_bad_hash_input(parent, tokens, message):
    with pytest.raises(ValueError, match=message):
        hash_block(parent, tokens)


def test_free_uncached_blocks_go_first_then_cached_ones_least_recently_freed():
    evicted = []
    pool = BlockPool(4, on_evict=lambda h, b: evicted.append((h, b)))
    blocks = pool.allocate(4)
    assert blocks == [0, 1, 2, 3] and pool.num_free_blocks == 0
    for b in (0, 1, 2):
        assert pool.cache(b, bytes([b]) * 32)
    pool.release([2, 0, 3, 1])  # cached ones enter the LRU in this order: 2, 0, 1
    assert pool.num_free_blocks == 4 and pool.num_cached_free_blocks == 3
    assert pool.lookup(bytes([0]) * 32) == 0  # free but still cached
    assert pool.allocate(1) == [3] and evicted == []  # the uncached block first
    assert pool.allocate(2) == [2, 0]
    assert evicted == [(bytes([2]) * 32, 2), (bytes([0]) * 32, 0)]
    assert pool.lookup(bytes([2]) * 32) is None and pool.block_hash(2) is None
    assert pool.num_cached_free_blocks == 1 and pool.num_evictions == 2


def test_taking_a_cached_block_shares_it_and_keeps_it_from_eviction():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.cache(a, SALT)
    pool.release([a, b])
    assert pool.num_unreferenced([a]) == 1
    pool.take([a])  # a prefix hit: out of the LRU, one reference
    pool.take([a])  # a second sharer
    assert pool.ref_count(a) == 2 and pool.num_free_blocks == 1
    assert pool.allocate(1) == [b]  # a is not evictable while referenced
    pool.release([a])
    assert pool.ref_count(a) == 1 and pool.num_free_blocks == 0
    pool.release([a, b])
    assert pool.num_free_blocks == 2 and pool.lookup(SALT) == a


def test_pool_misuse_is_refused():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    assert pool.cache(a, SALT) and not pool.cache(b, SALT)  # one block per content
    assert not pool.cache(a, bytes(32))  # already cached
    with pytest.raises(RuntimeError, match="not cached"):
        pool.take([b])
    pool.release([b])
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.release([b])
    with pytest.raises(RuntimeError, match="free"):
        pool.cache(b, bytes(32))
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate(2)
