import numpy as np
import pytest

from hifc.analysis.ftl import FtlConfig, PageMappedFtl, simulate


def test_sequential_circular_writes_have_waf_exactly_one():
    config = FtlConfig(logical_pages=4096, pages_per_erase_block=64, over_provisioning=0.07)
    stats = simulate(config, [np.arange(4096)] * 10)
    assert stats.host_page_writes == 40960
    assert stats.gc_count > 0 and stats.gc_relocated_pages == 0
    assert stats.waf == 1.0


def test_sequential_on_empty_drive_with_unaligned_capacity():
    config = FtlConfig(logical_pages=4000, pages_per_erase_block=64, over_provisioning=0.07,
                       precondition=False)
    stats = simulate(config, [np.arange(4000)] * 10)
    assert stats.waf == 1.0


def test_random_overwrites_at_high_utilisation_amplify():
    rng = np.random.default_rng(0)
    config = FtlConfig(logical_pages=4096, pages_per_erase_block=64, over_provisioning=0.07)
    writes = [rng.choice(4096, size=32, replace=False) for _ in range(1000)]
    stats = simulate(config, writes)
    assert stats.nand_page_writes == stats.host_page_writes + stats.gc_relocated_pages
    assert stats.waf > 2.0


def test_more_over_provisioning_lowers_waf():
    rng = np.random.default_rng(1)
    writes = [rng.choice(4096, size=32, replace=False) for _ in range(600)]
    tight = simulate(FtlConfig(4096, 64, over_provisioning=0.07), writes)
    roomy = simulate(FtlConfig(4096, 64, over_provisioning=0.5), writes)
    assert roomy.waf < tight.waf


def test_config_and_write_validation():
    with pytest.raises(ValueError, match="spare erase blocks"):
        FtlConfig(logical_pages=1024, pages_per_erase_block=256, over_provisioning=0.07)
    with pytest.raises(ValueError, match="over_provisioning"):
        FtlConfig(logical_pages=1024, over_provisioning=-0.1)
    ftl = PageMappedFtl(FtlConfig(logical_pages=1024, pages_per_erase_block=16))
    with pytest.raises(ValueError, match="out of range"):
        ftl.write(np.array([1024]))
    with pytest.raises(ValueError, match="no host writes"):
        ftl.stats().waf
