"""POSIX backend: positional vectored I/O on an ``O_DIRECT`` descriptor from aligned buffers.

The descriptor is reopened from an already-open (symlink-checked) control descriptor through
``/proc/self/fd`` so the path cannot be swapped underneath. File systems that refuse ``O_DIRECT``
(tmpfs on older kernels, some overlay and network file systems answer ``EINVAL``) get buffered
I/O instead; ``direct`` and ``notes`` say which is in effect. Parallelism comes from the tier's
I/O thread pool: ``preadv``/``pwritev`` release the GIL.
"""
from __future__ import annotations

import errno
import os

import torch

from hifc.tiers.flash.io_base import FileIO, IOPriority, aligned_empty, host_view
from hifc.tiers.flash.layout import ALIGN


def reopen(control_fd: int, path: str, flags: int) -> int:
    """Open the same file as ``control_fd`` again with other flags, never following links."""
    flags |= os.O_CLOEXEC
    proc = f"/proc/self/fd/{control_fd}"
    fd = os.open(proc, flags) if os.path.exists(proc) else os.open(path, flags | os.O_NOFOLLOW)
    a, b = os.fstat(fd), os.fstat(control_fd)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
        os.close(fd)
        raise ValueError(f"cache file {path!r} changed while it was being opened")
    return fd


def open_data_fd(control_fd: int, path: str, want_direct: bool = True) -> tuple[int, bool, str]:
    """A read/write descriptor for data I/O: (fd, direct, note)."""
    if want_direct:
        try:
            fd = reopen(control_fd, path, os.O_RDWR | os.O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            note = f"O_DIRECT refused by the file system at open ({exc.strerror})"
        else:
            probe = aligned_empty(ALIGN, torch.device("cpu"))
            try:
                os.preadv(fd, [host_view(probe)], 0)
                return fd, True, "O_DIRECT in effect"
            except OSError as exc:
                os.close(fd)
                if exc.errno != errno.EINVAL:
                    raise
                note = f"O_DIRECT refused by the file system on read ({exc.strerror})"
        note += "; falling back to buffered I/O (page cache in the path)"
    else:
        note = "buffered I/O requested (O_DIRECT off)"
    return reopen(control_fd, path, os.O_RDWR), False, note


class PosixIO(FileIO):
    name = "posix"

    def __init__(self, control_fd: int, path: str, *, want_direct: bool = True):
        super().__init__()
        self._fd, self.direct, note = open_data_fd(control_fd, path, want_direct)
        self.notes.append(note)

    def staging_device(self, kv_device: torch.device) -> torch.device:
        return torch.device("cpu")

    def write(self, buf: torch.Tensor, file_offset: int,
              priority: IOPriority = IOPriority.SWAP_OUT) -> int:
        view, done = host_view(buf), 0
        while done < len(view):
            n = os.pwritev(self._fd, [view[done:]], file_offset + done)
            if n <= 0:
                raise OSError(errno.ENOSPC, f"write made no progress at offset {file_offset + done}")
            done += n
        return done

    def read(self, buf: torch.Tensor, file_offset: int,
             priority: IOPriority = IOPriority.SWAP_IN) -> int:
        view, done = host_view(buf), 0
        while done < len(view):
            n = os.preadv(self._fd, [view[done:]], file_offset + done)
            if n <= 0:
                break  # end of file: the caller sees a short read
            done += n
        return done

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
