"""The shape of one KV block, shared by every tier, and runs of consecutive block ids
(torch-free)."""
from __future__ import annotations

from dataclasses import dataclass

from hifc.dtypes import ITEMSIZE, is_fp8

SCALE_DIGEST_CHARS = 32  # hex digits of a float8 cache's scale digest


@dataclass(frozen=True)
class KVGeometry:
    """Shape of one KV block across the whole model: the cache tensor is
    ``[num_layers, 2, num_gpu_blocks, block_size, num_kv_heads, head_dim]``.

    A float8 cache's bytes mean something only with the scales they were quantised with:
    ``scale_digest`` names them (``hifc.runtime.kv_cache.scale_digest``), so that the tiers'
    files and the model salt tell caches of other scales apart; "" for unscaled dtypes."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    scale_digest: str = ""

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KVGeometry.{name} must be a positive int, got {value!r}")
        if self.dtype not in ITEMSIZE:
            raise ValueError(
                f"KVGeometry.dtype must be one of {sorted(ITEMSIZE)}, got {self.dtype!r}")
        digest = self.scale_digest
        if not isinstance(digest, str) or (digest and (
                len(digest) != SCALE_DIGEST_CHARS or not is_fp8(self.dtype)
                or digest.strip("0123456789abcdef"))):
            raise ValueError(f"KVGeometry.scale_digest must be '' or, for a float8 dtype, "
                             f"{SCALE_DIGEST_CHARS} lowercase hex digits; got {digest!r} for "
                             f"{self.dtype}")

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def slice_elems(self) -> int:
        """Elements in one (layer, K/V, block) slice."""
        return self.block_size * self.num_kv_heads * self.head_dim

    @property
    def slice_bytes(self) -> int:
        """The paper's block_size_bytes: one (layer, K/V, block) slice."""
        return self.slice_elems * self.itemsize

    @property
    def num_slices(self) -> int:
        """Slices per block: K and V of every layer."""
        return 2 * self.num_layers

    @property
    def block_bytes(self) -> int:
        """KV payload of one block across all layers (what a swap moves per block)."""
        return self.num_slices * self.slice_bytes


def runs_of(ids: list[int]) -> list[tuple[int, int, int]]:
    """(first id, position, length) of each run of consecutive ids."""
    runs: list[tuple[int, int, int]] = []
    for pos, block in enumerate(ids):
        if runs and block == runs[-1][0] + runs[-1][2]:
            first, at, length = runs[-1]
            runs[-1] = (first, at, length + 1)
        else:
            runs.append((block, pos, 1))
    return runs
