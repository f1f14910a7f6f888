"""The I/O lists of ``hifc bench io`` and its raw side: the ``(offset, length)`` runs a tier
sequential phase issues (kvikio's per-request split included), the raw O_DIRECT baseline that
replays them from plain threads, and the file system the cache file is on."""
from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import queue
import re
import time

MIB = 1 << 20


def tier_io_tasks(layout, ids: list[int], batch: int, chunk_blocks: int) -> list[list[tuple]]:
    """The ``(file offset, length)`` runs of swapping ``ids`` in jobs of ``batch`` blocks: one
    list per chunk task, i.e. what one tier worker thread transfers in one go."""
    from hifc.tiers.flash.mover import split_chunks

    tasks = []
    for i in range(0, len(ids), batch):
        for chunk in split_chunks([(0, b) for b in ids[i:i + batch]], 1, chunk_blocks):
            plan = layout.chunk_plan(chunk[0][1], len(chunk))
            tasks.append([(offset, length) for offset, _, length in plan.runs])
    return tasks


def split_pieces(tasks: list[list[tuple]], piece: int | None) -> list[list[tuple]]:
    """kvikio fans every request out over its thread pool in ``piece``-byte tasks."""
    if not piece:
        return tasks
    return [[(offset + at, min(piece, length - at))]
            for task in tasks for offset, length in task for at in range(0, length, piece)]


def kvikio_task_bytes() -> int | None:
    import kvikio.defaults
    for read in (lambda: kvikio.defaults.get("task_size"), lambda: kvikio.defaults.task_size()):
        try:
            return int(read())
        except Exception:  # the setting moved between kvikio versions
            continue
    return None


def io_summary(tasks: list[list[tuple]]) -> dict:
    sizes = [length for task in tasks for _, length in task]
    return {"ios": len(sizes), "bytes": sum(sizes), "io_bytes_min": min(sizes),
            "io_bytes_max": max(sizes), "io_bytes_mean": sum(sizes) / len(sizes)}


def describe_sizes(s: dict) -> str:
    lo, hi = s["io_bytes_min"] / MIB, s["io_bytes_max"] / MIB
    mean = s["io_bytes_mean"] / MIB
    size = f"{hi:.2f} MiB" if lo == hi else f"{lo:.2f}-{hi:.2f} MiB (mean {mean:.2f})"
    return f"{s['ios']} I/Os of {size}"


def filesystem_of(path: str) -> dict:
    """File system type and source of the mount holding ``path`` (from /proc/self/mounts)."""
    where = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    best = {"type": "unknown", "source": "?", "mount": "/"}
    try:
        with open("/proc/self/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # \040
        inside = where == mount or where.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best["mount"]):
            best = {"type": fields[2], "source": fields[0], "mount": mount}
    return best


class RawIO:
    """The baseline: plain (O_DIRECT where possible) ``pwritev``/``preadv`` on the cache file
    from ``threads`` threads, one I/O task per thread at a time, nothing but I/O."""

    def __init__(self, path: str, threads: int, buffer_bytes: int, want_direct: bool):
        import torch

        from hifc.tiers.flash.io_base import aligned_empty, host_view
        from hifc.tiers.flash.posix_io import open_data_fd

        control = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self.fd, self.direct, self.note = open_data_fd(control, path, want_direct)
        finally:
            os.close(control)
        self._buffers: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(threads):
            buf = aligned_empty(buffer_bytes, torch.device("cpu"))
            self._buffers.put(buf.copy_(torch.randint(0, 256, (buffer_bytes,), dtype=torch.uint8)))
        self._pool = cf.ThreadPoolExecutor(threads, thread_name_prefix="hifc-raw-io")
        self._view = host_view
        self.sync_writes = False  # buffered I/O: a write phase ends with fdatasync, timed

    def _task(self, call, runs) -> None:
        buf = self._buffers.get()
        try:
            for offset, length in runs:
                if call(self.fd, [self._view(buf[:length])], offset) != length:
                    raise OSError(errno.EIO, f"raw {call.__name__} short at offset {offset}")
        finally:
            self._buffers.put(buf)

    def run(self, tasks, write: bool) -> float:
        call = os.pwritev if write else os.preadv
        start = time.perf_counter()
        list(self._pool.map(lambda runs: self._task(call, runs), tasks))
        if write:
            self.sync()
        return time.perf_counter() - start

    def sync(self) -> None:
        if self.sync_writes:
            os.fdatasync(self.fd)

    def drop_cache(self) -> None:
        """Write back and evict the file's cached pages (all descriptors share them)."""
        os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        os.close(self.fd)


def precondition_tasks(start: int, end: int, io_bytes: int) -> list[list[tuple]]:
    return [[(at, min(io_bytes, end - at))] for at in range(start, end, io_bytes)]
