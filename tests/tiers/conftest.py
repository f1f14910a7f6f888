"""Fixtures shared by the tier tests."""
from __future__ import annotations

import pytest

from hifc.tiers import KVGeometry, TierConfig, make_tier
from tests.tiers.tier_helpers import SMALL


@pytest.fixture
def flash(tmp_path):
    """Factory: a flash tier in tmp_path, closed at the end of the test."""
    tiers = []

    def build(geometry: KVGeometry = SMALL, name: str = "cache.kvc", num_blocks: int = 32,
              fault_injection: bool = False, prefix_store: str = "evicted", **flash_options):
        """flash_options: TierConfig's flash_* options without the prefix (layout=...)."""
        options = {f"flash_{k}": v for k, v in flash_options.items()}
        config = TierConfig(kv_offload="flash", flash_path=str(tmp_path / name),
                            num_tier_blocks=num_blocks, tier_fault_injection=fault_injection,
                            prefix_store=prefix_store, **options)
        tier = make_tier(config, geometry)
        tiers.append(tier)
        return tier

    yield build
    for tier in tiers:
        tier.close()
