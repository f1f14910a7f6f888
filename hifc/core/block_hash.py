"""Content hashes of full KV blocks, chained from a model salt (torch-free).

A full block of ``block_size`` tokens is named by

    hash_i = blake2b(parent_i || token_ids_i, digest_size=32)

where ``parent_0`` is the model salt (32 bytes: the weights, dtype, block size and KV geometry,
see ``hifc.engine.model_salt``) and ``parent_i = hash_{i-1}``; ``token_ids_i`` are the block's
token ids, each as a 4-byte unsigned little-endian integer. A hash therefore names the whole
prefix up to and including its block, for one model: equal hashes mean equal K/V. The second
prefix level (the flash store) keys its records by the same 32 bytes.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BLOCK_HASH_BYTES = 32
_MAX_TOKEN_ID = 2 ** 32 - 1


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The hash of a block whose tokens are ``token_ids``, after the prefix named by ``parent``
    (the salt for the first block)."""
    if len(parent) != BLOCK_HASH_BYTES:
        raise ValueError(f"a parent hash (or salt) is {BLOCK_HASH_BYTES} bytes, got {len(parent)}")
    try:
        tokens = struct.pack(f"<{len(token_ids)}I", *token_ids)
    except struct.error:
        raise ValueError(f"token ids must be integers in 0..{_MAX_TOKEN_ID}") from None
    return hashlib.blake2b(parent + tokens, digest_size=BLOCK_HASH_BYTES).digest()


def chain_block_hashes(parent: bytes, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Hashes of the full blocks of ``token_ids`` (a trailing partial block has none), chained
    after ``parent``: the salt for a sequence's first block, else the hash of the block before
    ``token_ids[0]``."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes
