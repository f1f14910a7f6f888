"""kvikio backend: cuFile I/O straight from/to GPU memory.

With the nvidia-fs driver present this is GPUDirect Storage (DMA between the SSD and GPU memory,
no host bounce); without it kvikio runs in compat mode (POSIX I/O through kvikio's own pinned
bounce buffers), which ``notes`` reports. kvikio splits each request into ``task_size`` pieces
over its own thread pool of ``io_threads`` threads; O_DIRECT is asked for both reads and writes
so the page cache stays out of the measurement and the path.
"""
from __future__ import annotations

import errno
import os

import torch

from hifc.tiers.flash.io_base import FileIO, IOPriority, host_view
from hifc.tiers.flash.posix_io import open_data_fd


def kvikio_available() -> bool:
    """True when kvikio imports and a CUDA device is visible (kvikio needs libcuda)."""
    if not torch.cuda.is_available():
        return False
    try:
        import kvikio  # noqa: F401
    except Exception:  # ImportError, or a missing shared library
        return False
    return True


def gds_available() -> bool:
    """True when kvikio can do GPUDirect Storage here (kvikio imports, a CUDA device, the
    nvidia-fs driver loaded, compat mode not forced)."""
    if not kvikio_available():
        return False
    import kvikio.defaults
    return not kvikio.defaults.is_compat_mode_preferred() and _gds_driver_present()


def _gds_driver_present() -> bool:
    try:
        import kvikio.cufile_driver
        return bool(kvikio.cufile_driver.get("is_gds_available"))
    except Exception:  # cuFile library missing or driver not loadable
        return False


class KvikioIO(FileIO):
    name = "kvikio"

    def __init__(self, control_fd: int, path: str, *, io_threads: int = 8,
                 want_direct: bool = True):
        super().__init__()
        if not kvikio_available():
            raise ValueError("backend 'kvikio' needs the kvikio package and a CUDA device")
        import kvikio
        import kvikio.defaults

        # kvikio opens its own O_DIRECT descriptor; probe first whether the file system takes it.
        fd, direct, note = open_data_fd(control_fd, path, want_direct)
        os.close(fd)
        settings = {"num_threads": io_threads, "auto_direct_io_read": direct,
                    "auto_direct_io_write": direct}
        for key, value in settings.items():
            try:
                kvikio.defaults.set(key, value)  # process-wide kvikio setting
            except (KeyError, ValueError, AttributeError):
                self.notes.append(f"kvikio {kvikio.__version__} has no setting {key!r}")
        proc = f"/proc/self/fd/{control_fd}"
        self._file = kvikio.CuFile(proc if os.path.exists(proc) else path, "r+")
        compat = kvikio.defaults.is_compat_mode_preferred()
        self.direct = direct
        self.gds = not compat and _gds_driver_present()  # gds_available(), already imported
        mode = ("GPUDirect Storage (nvidia-fs driver present)" if self.gds else
                "cuFile without the nvidia-fs driver (cuFile compat path)" if not compat else
                "compat mode (no GDS: POSIX I/O through kvikio bounce buffers)")
        self.notes.append(f"kvikio {kvikio.__version__}: {mode}, {io_threads} threads; {note}")

    def staging_device(self, kv_device: torch.device) -> torch.device:
        return torch.device(kv_device)

    @staticmethod
    def _target(buf: torch.Tensor):
        return buf if buf.device.type == "cuda" else host_view(buf)

    def _transfer(self, op, buf: torch.Tensor, file_offset: int, what: str) -> int:
        try:
            return op(self._target(buf), buf.numel(), file_offset).get()
        except RuntimeError as exc:  # kvikio reports I/O failures as RuntimeError
            raise OSError(errno.EIO, f"kvikio {what} at offset {file_offset} failed: {exc}") \
                from None

    def write(self, buf: torch.Tensor, file_offset: int,
              priority: IOPriority = IOPriority.SWAP_OUT) -> int:
        return self._transfer(self._file.pwrite, buf, file_offset, "write")

    def read(self, buf: torch.Tensor, file_offset: int,
             priority: IOPriority = IOPriority.SWAP_IN) -> int:
        return self._transfer(self._file.pread, buf, file_offset, "read")

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
