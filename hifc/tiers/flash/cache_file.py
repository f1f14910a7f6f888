"""The preallocated flash cache file and its superblock (torch-free).

Superblock (first 4 KiB)::

    magic "HIFCKVC1" | format version u32 | num_layers u32 | num_kv_heads u32 | head_dim u32
    | block_size u32 | dtype 16s | layout 16s | num_blocks u64 | file_bytes u64 | epoch u64
    | crc32c of the preceding bytes

Opening (:meth:`CacheFile.open`):

* a missing path is created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and mode 0600, and preallocated
  to its full size (``posix_fallocate``);
* an existing hifc cache file of the same format version, geometry, layout and size is
  *reused*: only a new epoch is written to the superblock, which takes O(1) time whatever the
  size (the paper's fast initialisation) and makes every swap record of earlier runs stale
  (prefix records stay valid: the flash tier indexes them, :mod:`hifc.tiers.flash.scan`);
* an hifc file of another format version or geometry is reinitialised (resized, preallocated,
  new epoch): nothing of it is found, nothing of it is read;
* any other non-empty file is refused unless ``force=True``; symbolic links are always refused
  (``O_NOFOLLOW``), and so is anything that is not a regular file;
* the file is locked (``flock``) so two processes cannot share it, and set to mode 0600.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import time

import crc32c

from hifc.tiers.flash.layout import SUPERBLOCK_BYTES, Layout
from hifc.tiers.geometry import KVGeometry

SUPER_MAGIC = b"HIFCKVC1"
FORMAT_VERSION = 2  # 2: record kinds (swap, prefix), salt, hash and log sequence numbers
_SUPER = struct.Struct("<8sIIIII16s16sQQQ")
_SUPER_CRC = struct.Struct("<I")


def new_epoch(old: int = 0) -> int:
    while True:
        epoch = int.from_bytes(os.urandom(8), "little")
        if epoch not in (0, old):
            return epoch


class CacheFile:
    """An open, locked, preallocated cache file. ``fd`` is a buffered control descriptor; data
    I/O uses the backends' own descriptors (see :mod:`hifc.tiers.flash.posix_io`)."""

    def __init__(self, path: str, fd: int, layout: Layout, epoch: int, reused: bool,
                 init_seconds: float):
        self.path = path
        self.fd = fd
        self.layout = layout
        self.epoch = epoch
        self.reused = reused  # True: matching file reopened in O(1), nothing reallocated
        self.init_seconds = init_seconds

    @classmethod
    def open(cls, path, layout: Layout, *, force: bool = False) -> "CacheFile":
        path = os.fspath(path)
        if not path:
            raise ValueError("cache file path is empty")
        start = time.perf_counter()
        fd, created = _open_nofollow(path)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"cache path {path!r} is not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(f"cache file {path!r} is in use by another process") from None
            os.fchmod(fd, 0o600)
            verdict = "create" if created or info.st_size == 0 else _judge(fd, layout, info.st_size)
            if verdict == "foreign" and not force:
                raise ValueError(f"{path!r} exists and is not an hifc cache file; refusing to "
                                 "overwrite it (pass force=True to reinitialise it)")
            old_epoch = _stored_epoch(fd) if verdict == "reuse" else 0
            if verdict != "reuse":
                _preallocate(fd, layout.file_bytes, path)
            epoch = new_epoch(old_epoch)
            _write_superblock(fd, layout, epoch)
        except BaseException:
            os.close(fd)
            if created:
                os.unlink(path)
            raise
        return cls(path, fd, layout, epoch, verdict == "reuse", time.perf_counter() - start)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # also releases the flock
            self.fd = -1


def _open_nofollow(path: str) -> tuple[int, bool]:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600), True
    except FileExistsError:
        pass
    try:
        return os.open(path, flags), False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"cache path {path!r} is a symbolic link; refusing to follow it") \
                from None
        raise


def _pack_superblock(layout: Layout, epoch: int) -> bytes:
    g: KVGeometry = layout.geometry
    body = _SUPER.pack(SUPER_MAGIC, FORMAT_VERSION, g.num_layers, g.num_kv_heads, g.head_dim,
                       g.block_size, g.dtype.encode(), layout.name.encode(), layout.num_blocks,
                       layout.file_bytes, epoch)
    page = body + _SUPER_CRC.pack(crc32c.crc32c(body))
    return page + bytes(SUPERBLOCK_BYTES - len(page))


def _read_superblock(fd: int) -> bytes:
    return os.pread(fd, SUPERBLOCK_BYTES, 0)


def _judge(fd: int, layout: Layout, size: int) -> str:
    """'reuse', 'reinit' (an hifc file of other geometry) or 'foreign'."""
    page = _read_superblock(fd)
    if len(page) < _SUPER.size + 4 or page[:8] != SUPER_MAGIC:
        return "foreign"
    body = page[:_SUPER.size]
    (stored_crc,) = _SUPER_CRC.unpack_from(page, _SUPER.size)
    if crc32c.crc32c(body) != stored_crc:
        return "reinit"  # ours, but its superblock is torn
    wanted = _pack_superblock(layout, 0)[:_SUPER.size - 8]  # everything but the epoch
    if body[:_SUPER.size - 8] != wanted or size != layout.file_bytes:
        return "reinit"
    return "reuse"


def _stored_epoch(fd: int) -> int:
    return _SUPER.unpack_from(_read_superblock(fd))[-1]


def _preallocate(fd: int, nbytes: int, path: str) -> None:
    os.ftruncate(fd, 0)  # drop old contents so no stale record survives a reinit
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"not enough space to preallocate {nbytes} bytes for "
                          f"cache file {path!r}") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, nbytes)  # file system without fallocate: a sparse file still works


def _write_superblock(fd: int, layout: Layout, epoch: int) -> None:
    page = _pack_superblock(layout, epoch)
    if os.pwrite(fd, page, 0) != len(page):
        raise OSError(errno.EIO, "short write of the cache file superblock")
    os.fdatasync(fd)


def read_superblock(path) -> dict:
    """Decode a cache file's superblock (for tools and tests)."""
    with open(path, "rb") as f:
        page = f.read(SUPERBLOCK_BYTES)
    if page[:8] != SUPER_MAGIC:
        raise ValueError(f"{os.fspath(path)!r} is not an hifc cache file")
    fields = _SUPER.unpack_from(page)
    (stored_crc,) = _SUPER_CRC.unpack_from(page, _SUPER.size)
    names = ("magic", "version", "num_layers", "num_kv_heads", "head_dim", "block_size", "dtype",
             "layout", "num_blocks", "file_bytes", "epoch")
    out = dict(zip(names, fields))
    out["dtype"] = out["dtype"].rstrip(b"\0").decode()
    out["layout"] = out["layout"].rstrip(b"\0").decode()
    out["crc_ok"] = crc32c.crc32c(page[:_SUPER.size]) == stored_crc
    return out
