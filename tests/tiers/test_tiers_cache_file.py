import os
import shutil
import stat
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from hifc.tiers import KVGeometry, TierConfig, make_tier
from hifc.tiers.flash.cache_file import CacheFile, read_superblock
from hifc.tiers.flash.layout import BLOCK_RECORD, make_layout

from tests.tiers.tier_helpers import SMALL


def test_created_preallocated_0600_with_superblock(flash, tmp_path):
    old = os.umask(0)  # even a permissive umask gives 0600
    try:
        tier = flash(num_blocks=20)
    finally:
        os.umask(old)
    path = tmp_path / "cache.kvc"
    info = os.stat(path)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_size == tier.layout.file_bytes
    assert info.st_blocks * 512 >= tier.layout.file_bytes  # really allocated, not sparse
    sb = read_superblock(path)
    assert sb["crc_ok"] and sb["epoch"] == tier.epoch
    assert (sb["num_layers"], sb["num_kv_heads"], sb["head_dim"], sb["block_size"],
            sb["dtype"], sb["num_blocks"], sb["layout"]) == (
        SMALL.num_layers, SMALL.num_kv_heads, SMALL.head_dim, SMALL.block_size, SMALL.dtype,
        20, tier.layout.name)
    assert tier.stats()["reused_file"] is False


def test_reopen_matching_geometry_keeps_file_and_changes_epoch(flash, tmp_path):
    first = flash(num_blocks=20)
    epoch = first.epoch
    first.close()
    path = tmp_path / "cache.kvc"
    inode = os.stat(path).st_ino
    with open(path, "r+b") as f:  # a marker in the data area survives a reopen
        f.seek(first.layout.file_bytes - 4096)
        f.write(b"marker")
    again = flash(num_blocks=20)
    assert again.stats()["reused_file"] is True
    assert again.epoch != epoch
    assert os.stat(path).st_ino == inode
    with open(path, "rb") as f:
        f.seek(first.layout.file_bytes - 4096)
        assert f.read(6) == b"marker"
    assert read_superblock(path)["epoch"] == again.epoch


def test_geometry_mismatch_reinitialises(flash, tmp_path):
    flash(num_blocks=20).close()
    bigger = flash(num_blocks=30)
    assert bigger.stats()["reused_file"] is False
    assert os.path.getsize(tmp_path / "cache.kvc") == bigger.layout.file_bytes
    bigger.close()
    other = KVGeometry(2, 2, 32, 16, "bfloat16")
    tier = flash(other, num_blocks=30)
    assert tier.stats()["reused_file"] is False
    assert read_superblock(tmp_path / "cache.kvc")["dtype"] == "bfloat16"


def test_foreign_file_refused_unless_forced(tmp_path):
    path = tmp_path / "precious.txt"
    path.write_bytes(b"important data\n" * 100)
    path.chmod(0o644)
    config = TierConfig(kv_offload="flash", flash_path=str(path), num_tier_blocks=4)
    with pytest.raises(ValueError, match="not an hifc cache file"):
        make_tier(config, SMALL)
    assert path.read_bytes() == b"important data\n" * 100  # untouched
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # judged before its mode was touched
    with make_tier(TierConfig(kv_offload="flash", flash_path=str(path), num_tier_blocks=4, flash_force=True), SMALL) as tier:
        assert tier.stats()["reused_file"] is False
    assert read_superblock(path)["num_blocks"] == 4


def test_symlink_refused(tmp_path):
    target = tmp_path / "real.kvc"
    make_tier(TierConfig(kv_offload="flash", flash_path=str(target),
                         num_tier_blocks=4), SMALL).close()
    link = tmp_path / "link.kvc"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        make_tier(TierConfig(kv_offload="flash", flash_path=str(link), num_tier_blocks=4), SMALL)
    dangling = tmp_path / "dangling.kvc"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="symbolic link"):
        make_tier(TierConfig(kv_offload="flash", flash_path=str(dangling),
                             num_tier_blocks=4), SMALL)
    assert not (tmp_path / "nowhere").exists()


def test_not_a_regular_file_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so opening for writing does not block
    try:
        with pytest.raises(ValueError, match="not a regular file"):
            make_tier(TierConfig(kv_offload="flash", flash_path=str(fifo),
                                 num_tier_blocks=4), SMALL)
    finally:
        os.close(fd)


def test_second_opener_refused_while_in_use(flash, tmp_path):
    flash(num_blocks=4)
    with pytest.raises(ValueError, match="in use"):
        make_tier(TierConfig(kv_offload="flash", flash_path=str(tmp_path / "cache.kvc"),
                             num_tier_blocks=4), SMALL)


def test_reopen_time_does_not_depend_on_size(tmp_path):
    layout = make_layout(BLOCK_RECORD, SMALL, 4096)  # ~70 MiB
    path = tmp_path / "big.kvc"
    CacheFile.open(path, layout).close()
    reopened = CacheFile.open(path, layout)
    assert reopened.reused  # O(1): only the superblock was rewritten
    reopened.close()


def test_empty_path_and_missing_dir(tmp_path):
    with pytest.raises(ValueError, match="path"):
        TierConfig(kv_offload="flash", flash_path="", num_tier_blocks=4)
    with pytest.raises(FileNotFoundError):
        make_tier(TierConfig(kv_offload="flash", flash_path=str(tmp_path / "no" / "such.kvc"), num_tier_blocks=4), SMALL)


_KILLED_AFTER_PREALLOCATION = textwrap.dedent("""
    import os, sys
    from hifc.tiers.flash.cache_file import CacheFile
    from hifc.tiers.flash.layout import BLOCK_RECORD, make_layout
    from hifc.tiers.geometry import KVGeometry
    fallocate = os.posix_fallocate
    def fallocate_then_die(fd, offset, length):
        fallocate(fd, offset, length)
        os._exit(9)  # the process is killed right after preallocating
    os.posix_fallocate = fallocate_then_die
    geometry = KVGeometry(2, 2, 32, 16, "float16")
    CacheFile.open(sys.argv[1], make_layout(BLOCK_RECORD, geometry, int(sys.argv[2])))
""")


@pytest.mark.parametrize("existing_blocks", [None, 4], ids=["new-file", "other-size"])
def test_run_killed_while_preallocating_leaves_a_file_later_runs_accept(tmp_path,
                                                                       existing_blocks):
    path = tmp_path / "cache.kvc"
    if existing_blocks is not None:
        make_tier(TierConfig(kv_offload="flash", flash_path=str(path), num_tier_blocks=existing_blocks), SMALL).close()
    killed = subprocess.run([sys.executable, "-c", _KILLED_AFTER_PREALLOCATION, str(path), "8"],
                            capture_output=True, text=True)
    assert killed.returncode == 9, killed.stderr
    assert read_superblock(path)["crc_ok"]  # the superblock was written before preallocating
    with make_tier(TierConfig(kv_offload="flash", flash_path=str(path), num_tier_blocks=8), SMALL) as tier:
        assert tier.num_blocks == 8
    assert read_superblock(path)["epoch"] == tier.epoch


def test_symlinked_parent_directory_is_resolved_once(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    with make_tier(TierConfig(kv_offload="flash", flash_path=str(tmp_path / "link" / "kv"), num_tier_blocks=4), SMALL) as tier:
        resolved = os.path.join(os.path.realpath(real), "kv")
        assert tier.cache_file.path == resolved
        assert tier.stats()["path"] == resolved
    assert (real / "kv").is_file()


HUGE_BLOCKS = KVGeometry(num_layers=100, num_kv_heads=64, head_dim=256, block_size=256,
                         dtype="float32")  # 3.4 GB per block


@pytest.mark.parametrize("geometry, size_gib", [
    (SMALL, 1e6),  # ~10**11 blocks: refused before any per-block bookkeeping is built
    (HUGE_BLOCKS, None),  # a few thousand blocks, four times the free space
], ids=["1e6-GiB", "4x-free-space"])
def test_tier_larger_than_free_space_is_refused_first(tmp_path, geometry, size_gib):
    size_gib = size_gib or 4 * shutil.disk_usage(tmp_path).free / 2**30
    path = tmp_path / "kv"
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"does not fit on the file system of .* GiB free; "
                                             r"choose a smaller size \(flash_size_gib\)"):
            make_tier(TierConfig(kv_offload="flash", flash_path=str(path), flash_size_gib=size_gib), geometry)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert not path.exists()
