"""Fault injection for tests: a backend wrapper that fails chosen I/Os on purpose.

Effects (``FaultInjector.arm``):

``eio``      the read or write raises ``OSError(EIO)``;
``enospc``   the write raises ``OSError(ENOSPC)``;
``short``    the read returns only the first half of the bytes asked for (4 KiB aligned);
``bitflip``  the read succeeds but one bit of the returned bytes is flipped (at ``byte_offset``
             within the I/O), as a silent media error would do.

Each armed fault lets ``skip`` matching I/Os pass, then hits the next ``times`` of them. The tier
must report every hit as a job error and stay usable.
"""
from __future__ import annotations

import errno
import threading
from dataclasses import dataclass

import torch

from hifc.tiers.flash.io_base import FileIO, IOPriority
from hifc.tiers.flash.layout import ALIGN

EFFECTS = {"read": ("eio", "short", "bitflip"), "write": ("eio", "enospc")}


@dataclass
class _Fault:
    op: str
    effect: str
    skip: int
    times: int
    byte_offset: int


class FaultInjector:
    """Thread-safe list of armed faults, shared between a test and a :class:`FaultyIO`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self.hits = 0

    def arm(self, op: str, effect: str, *, times: int = 1, skip: int = 0,
            byte_offset: int = 0) -> None:
        if op not in EFFECTS:
            raise ValueError(f"fault op must be one of {list(EFFECTS)}, got {op!r}")
        if effect not in EFFECTS[op]:
            raise ValueError(f"fault effect for {op} must be one of {list(EFFECTS[op])}, "
                             f"got {effect!r}")
        if times < 1 or skip < 0 or byte_offset < 0:
            raise ValueError("fault needs times >= 1, skip >= 0 and byte_offset >= 0")
        with self._lock:
            self._faults.append(_Fault(op, effect, skip, times, byte_offset))

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def armed(self) -> int:
        with self._lock:
            return sum(f.times for f in self._faults)

    def _take(self, op: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.op != op:
                    continue
                if fault.skip:
                    fault.skip -= 1
                    return None
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
                self.hits += 1
                return fault
        return None


class FaultyIO(FileIO):
    """Wraps a real backend and applies the injector's armed faults."""

    def __init__(self, inner: FileIO, injector: FaultInjector):
        super().__init__()
        self.inner = inner
        self.injector = injector
        self.name = f"{inner.name}+faults"
        self.direct = inner.direct
        self.notes = inner.notes + ["fault injection enabled"]

    def staging_device(self, kv_device: torch.device) -> torch.device:
        return self.inner.staging_device(kv_device)

    def write(self, buf: torch.Tensor, file_offset: int,
              priority: IOPriority = IOPriority.SWAP_OUT) -> int:
        fault = self.injector._take("write")
        if fault is not None:
            code = errno.EIO if fault.effect == "eio" else errno.ENOSPC
            raise OSError(code, f"injected {fault.effect} on write at offset {file_offset}")
        return self.inner.write(buf, file_offset, priority)

    def read(self, buf: torch.Tensor, file_offset: int,
             priority: IOPriority = IOPriority.SWAP_IN) -> int:
        fault = self.injector._take("read")
        if fault is None:
            return self.inner.read(buf, file_offset, priority)
        if fault.effect == "eio":
            raise OSError(errno.EIO, f"injected eio on read at offset {file_offset}")
        if fault.effect == "short":
            half = buf.numel() // 2 // ALIGN * ALIGN  # keep O_DIRECT alignment
            return self.inner.read(buf[:half], file_offset, priority) if half else 0
        got = self.inner.read(buf, file_offset, priority)
        pos = min(fault.byte_offset, buf.numel() - 1)
        buf[pos:pos + 1].bitwise_xor_(1)  # flip the lowest bit of one byte
        if buf.is_cuda:  # done before the caller's stream reads the buffer
            torch.cuda.current_stream(buf.device).synchronize()
        return got

    def close(self) -> None:
        self.inner.close()
