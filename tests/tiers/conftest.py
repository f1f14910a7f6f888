"""Fixtures shared by the tier tests."""
from __future__ import annotations

import pytest

from hifc.tiers import KVGeometry, TierConfig, make_tier
from tests.tiers.tier_helpers import SMALL


@pytest.fixture
def flash(tmp_path):
    """Factory: a flash tier in tmp_path, closed at the end of the test."""
    tiers = []

    def build(geometry: KVGeometry = SMALL, name: str = "cache.kvc", **overrides):
        overrides.setdefault("num_blocks", 32)
        config = TierConfig(kind="flash", path=str(tmp_path / name), **overrides)
        tier = make_tier(config, geometry)
        tiers.append(tier)
        return tier

    yield build
    for tier in tiers:
        tier.close()
