"""The model salt: 32 bytes naming everything a KV block's content depends on besides its tokens.

It is the parent hash of a sequence's first block (``hifc.core.block_hash``), so block hashes
from different models, dtypes, block sizes or KV shapes never meet, while two engines on the
same model agree (a persistent prefix store keys its records by it). It hashes, each field
length-prefixed:

- the weights' identity: for a random preset its name and seed; for a file model, per weight
  file (a GGUF file; a Hugging Face directory's safetensors files and config.json, in name
  order) its size, its first MiB (headers: tensor names, shapes, offsets, GGUF metadata), its
  last 4 KiB and 64 evenly spaced 4 KiB samples of the weights. Reading ~1.3 MiB per file keeps
  start-up fast on a multi-GB model; the path itself is left out, so a copied model matches;
- the architecture (every field of ``ModelArchConfig``: RoPE, norms, head counts, ...);
- the KV geometry: layers, KV heads, head dim, block size, dtype and, for a float8 cache, the
  digest of its scales (KV quantised with other scales is another KV).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from hifc.loader import ALIASES, RANDOM_PREFIX
from hifc.loader.hf import safetensors_files
from hifc.models.config import ModelArchConfig
from hifc.tiers.geometry import KVGeometry

SALT_BYTES = 32
_FORMAT = b"hifc-model-salt-v1"
_HEAD_BYTES = 1 << 20
_SAMPLE_BYTES = 4096
_NUM_SAMPLES = 64


def model_salt(model: str, seed: int, arch: ModelArchConfig, geometry: KVGeometry) -> bytes:
    """The salt of ``model`` (as ``EngineConfig.model`` names it) loaded with ``seed``."""
    h = hashlib.blake2b(digest_size=SALT_BYTES)
    for field in (_FORMAT, _weights_identity(model, seed), _canonical_json(arch),
                  _canonical_json(geometry)):
        h.update(len(field).to_bytes(8, "little"))
        h.update(field)
    return h.digest()


def _canonical_json(config) -> bytes:
    return json.dumps(dataclasses.asdict(config), sort_keys=True, default=sorted).encode()


def _weights_identity(model: str, seed: int) -> bytes:
    if model.startswith(RANDOM_PREFIX):
        return f"{model} seed={seed}".encode()
    path = ALIASES[model]() if model in ALIASES else Path(model).expanduser()
    files = [path] if path.is_file() else [*safetensors_files(path), path / "config.json"]
    return b"".join(_file_fingerprint(f) for f in sorted(files, key=lambda f: f.name))


def _file_fingerprint(path: Path) -> bytes:
    """Size, head, tail and evenly spaced samples of one file, hashed."""
    h = hashlib.blake2b(digest_size=SALT_BYTES)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        h.update(size.to_bytes(8, "little"))
        offsets = [0] + [size * i // _NUM_SAMPLES for i in range(1, _NUM_SAMPLES)]
        offsets.append(max(0, size - _SAMPLE_BYTES))
        for i, offset in enumerate(offsets):
            f.seek(offset)
            h.update(f.read(_HEAD_BYTES if i == 0 else _SAMPLE_BYTES))
    return h.digest()
