"""The preallocated flash cache file and its superblock (torch-free).

Superblock (first 4 KiB)::

    magic "HIFCKVC1" | format version u32 | num_layers u32 | num_kv_heads u32 | head_dim u32
    | block_size u32 | dtype 16s | layout 16s | scale digest 32s | tp_rank u32 | tp_size u32
    | num_blocks u64 | file_bytes u64 | epoch u64 | crc32c of the preceding bytes

``dtype`` is the KV cache's element type (``float8_e4m3fn`` for an FP8 cache) and ``scale
digest`` names the scales a float8 cache is quantised with (hex, empty otherwise; see
``KVGeometry``): both are part of the geometry, so a file written in another dtype or with other
scales is reinitialised, never read. ``tp_rank`` of ``tp_size`` says which tensor-parallel
rank's shard of the KV heads the file holds (0 of 1 without tensor parallelism): a file of
another rank or rank count is reinitialised too.

Opening (:meth:`CacheFile.open`):

* the size is checked against the free space of the file system first (:func:`check_space`),
  before anything is created or allocated;
* the parent directory is resolved once (symbolic links in it are followed, and the file is
  known by its resolved path from then on); the last component must not be a symbolic link
  (``O_NOFOLLOW``), and the file must be a regular file;
* a missing path is created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and mode 0600;
* an existing hifc cache file of the same format version, geometry, layout and size is
  *reused*: only a new epoch is written to the superblock, which takes O(1) time whatever the
  size (the paper's fast initialisation) and makes every swap record of earlier runs stale
  (prefix records stay valid: the flash tier indexes them, :mod:`hifc.tiers.flash.scan`);
* an hifc file of another format version or geometry (dtype and scales included) is
  reinitialised (emptied, then rebuilt as a new file): nothing of it is found, nothing of it
  is read;
* any other non-empty file is refused unless ``force=True``, and left as it was (mode too);
* the file is locked (``flock``) so two processes cannot share it, and set to mode 0600.

A new or reinitialised file gets its superblock *before* it is preallocated to its full size, so
a run killed in between leaves a file that later runs recognise as theirs (and reinitialise),
never a zero-filled file they would refuse.
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

GIB = 1 << 30
SUPER_MAGIC = b"HIFCKVC1"
# 2: record kinds (swap, prefix), salt, hash and log sequence numbers; 3: the scale digest;
# 4: the tensor-parallel rank and size
FORMAT_VERSION = 4
_SUPER = struct.Struct("<8sIIIII16s16s32sIIQQQ")
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
                 created: bool, init_seconds: float, shard: tuple[int, int] = (0, 1)):
        self.path = path  # the parent directory resolved
        self.fd = fd
        self.layout = layout
        self.shard = shard  # (tensor-parallel rank, ranks) whose KV the file holds
        self.epoch = epoch
        self.reused = reused  # True: matching file reopened in O(1), nothing reallocated
        self.created = created  # True: the path did not exist before this open
        self.init_seconds = init_seconds

    @classmethod
    def open(cls, path, layout: Layout, *, force: bool = False,
             shard: tuple[int, int] = (0, 1)) -> "CacheFile":
        """``shard``: (rank, ranks) of the tensor-parallel shard the file holds."""
        path = resolve_parent(path)
        check_space(path, layout.file_bytes)
        start = time.perf_counter()
        fd, created = _open_nofollow(path)
        try:
            verdict = _claim(fd, path, layout, shard, created, force)
            epoch = new_epoch(_stored_epoch(fd) if verdict == "reuse" else 0)
            if verdict == "reuse":
                _write_superblock(fd, layout, shard, epoch)
            else:
                _initialise(fd, layout, shard, epoch, path)
        except BaseException:
            os.close(fd)
            if created:
                os.unlink(path)
            raise
        return cls(path, fd, layout, epoch, verdict == "reuse", created,
                   time.perf_counter() - start, shard)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # also releases the flock
            self.fd = -1

    def discard(self) -> None:
        """Close, and delete the file if this open created it (after a failed start)."""
        self.close()
        if self.created:
            os.unlink(self.path)
            self.created = False


def resolve_parent(path) -> str:
    """``path`` with its parent directory resolved (symbolic links followed, made absolute);
    the last component is kept as given."""
    path = os.fspath(path)
    if not path:
        raise ValueError("cache file path is empty")
    directory, name = os.path.split(path)
    if not name or name in (".", ".."):
        raise ValueError(f"cache path {path!r} names a directory, not a file")
    return os.path.join(os.path.realpath(directory or "."), name)


def check_space(path: str, nbytes: int) -> None:
    """ValueError unless a cache file of ``nbytes`` bytes fits on the file system that would hold
    ``path`` (the space of an existing file at ``path`` counts as free: it is reused or
    replaced). Raises the OSError of a missing or unreadable directory."""
    info = os.statvfs(os.path.dirname(path))
    free = info.f_bavail * info.f_frsize
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        existing = None
    if existing is not None and stat.S_ISREG(existing.st_mode):
        free += existing.st_blocks * 512
    if nbytes > free:
        raise ValueError(f"a flash tier of {nbytes / GIB:.4g} GiB does not fit on the file "
                         f"system of {os.path.dirname(path)!r}: {free / GIB:.4g} GiB free; "
                         "choose a smaller size (flash_size_gib)")


def _claim(fd: int, path: str, layout: Layout, shard: tuple[int, int], created: bool,
           force: bool) -> str:
    """Check and lock an opened path, judge its contents ('create', 'reuse', 'reinit') and
    only then make it ours (mode 0600); a file that is refused is left as it was."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"cache path {path!r} is not a regular file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ValueError(f"cache file {path!r} is in use by another process") from None
    verdict = ("create" if created or info.st_size == 0
               else _judge(fd, layout, shard, info.st_size))
    if verdict == "foreign" and not force:
        raise ValueError(f"{path!r} exists and is not an hifc cache file; refusing to "
                         "overwrite it (pass force=True to reinitialise it)")
    os.fchmod(fd, 0o600)
    return verdict


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


def _pack_superblock(layout: Layout, shard: tuple[int, int], epoch: int) -> bytes:
    g: KVGeometry = layout.geometry
    body = _SUPER.pack(SUPER_MAGIC, FORMAT_VERSION, g.num_layers, g.num_kv_heads, g.head_dim,
                       g.block_size, g.dtype.encode(), layout.name.encode(),
                       g.scale_digest.encode(), *shard, layout.num_blocks, layout.file_bytes,
                       epoch)
    page = body + _SUPER_CRC.pack(crc32c.crc32c(body))
    return page + bytes(SUPERBLOCK_BYTES - len(page))


def _read_superblock(fd: int) -> bytes:
    return os.pread(fd, SUPERBLOCK_BYTES, 0)


def _judge(fd: int, layout: Layout, shard: tuple[int, int], size: int) -> str:
    """'reuse', 'reinit' (an hifc file of other geometry) or 'foreign'."""
    page = _read_superblock(fd)
    if len(page) < _SUPER.size + 4 or page[:8] != SUPER_MAGIC:
        return "foreign"
    body = page[:_SUPER.size]
    (stored_crc,) = _SUPER_CRC.unpack_from(page, _SUPER.size)
    if crc32c.crc32c(body) != stored_crc:
        return "reinit"  # ours, but its superblock is torn
    wanted = _pack_superblock(layout, shard, 0)[:_SUPER.size - 8]  # everything but the epoch
    if body[:_SUPER.size - 8] != wanted or size != layout.file_bytes:
        return "reinit"
    return "reuse"


def _stored_epoch(fd: int) -> int:
    return _SUPER.unpack_from(_read_superblock(fd))[-1]


def _initialise(fd: int, layout: Layout, shard: tuple[int, int], epoch: int, path: str) -> None:
    """Empty the file (no stale record survives), write the superblock, then preallocate: a
    crash at any point leaves an empty file or one with an hifc superblock."""
    os.ftruncate(fd, 0)
    _write_superblock(fd, layout, shard, epoch)
    _preallocate(fd, layout.file_bytes, path)
    os.fdatasync(fd)


def _preallocate(fd: int, nbytes: int, path: str) -> None:
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"not enough space to preallocate {nbytes} bytes for "
                          f"cache file {path!r}") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, nbytes)  # file system without fallocate: a sparse file still works


def _write_superblock(fd: int, layout: Layout, shard: tuple[int, int], epoch: int) -> None:
    page = _pack_superblock(layout, shard, epoch)
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
             "layout", "scale_digest", "tp_rank", "tp_size", "num_blocks", "file_bytes", "epoch")
    out = dict(zip(names, fields))
    for name in ("dtype", "layout", "scale_digest"):
        out[name] = out[name].rstrip(b"\0").decode()
    out["crc_ok"] = crc32c.crc32c(page[:_SUPER.size]) == stored_crc
    return out
