"""``y = x W^T (+ b)`` through cuBLASLt with an algorithm of one's choosing.

torch's cuBLASLt path runs the first algorithm of cuBLASLt's heuristic for a shape. For some
products of decode steps (a few dozen rows against a weight of tens of megabytes) and of long
prompt steps, later candidates of the same heuristic run faster (docs/RESULTS.md).
``MatmulPlan`` holds the descriptors of one shape and asks the heuristic for its candidates;
``run`` launches one of them on torch's current stream (so a CUDA graph being captured records
it like any kernel).

The library is the cuBLASLt that torch itself loaded (found in the process's mappings), called
through ctypes; the layouts are cuBLAS's column-major view of torch's row-major tensors:
``y^T [N, M] = W [K, N]^T x^T [K, M]``.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools

import torch

# cuBLAS / cuBLASLt enumerations (cublasLt.h, library_types.h).
_CUDA_R_32F = 0
_DATA_TYPES = {torch.float16: 2, torch.bfloat16: 14}
DTYPES = tuple(_DATA_TYPES)  # the element types a plan takes
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_EPILOGUE_BIAS = 4
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
_STATUS_SUCCESS = 0

WORKSPACE_BYTES = 32 << 20
WORKSPACE_LIMITS = (WORKSPACE_BYTES, 4 << 20, 1 << 20, 0)
MAX_CANDIDATES = 32


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class CublasLtError(RuntimeError):
    pass


def _check(status: int, what: str) -> None:
    if status != _STATUS_SUCCESS:
        raise CublasLtError(f"{what} failed with cuBLAS status {status}")


@contextlib.contextmanager
def torch_preference(library: str):
    """torch's matmuls inside run through ``library`` ("cublas" or "cublaslt"); the previous
    preference is restored after."""
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


@functools.cache
def _library() -> ctypes.CDLL:
    """The libcublasLt torch has loaded (after one cuBLASLt matmul, if it had not yet)."""
    def mapped() -> str | None:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libcublasLt.so" in path:
                    return path
        return None

    path = mapped()
    if path is None:
        with torch_preference("cublaslt"):
            a = torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
            torch.mm(a, a)
        path = mapped()
    if path is None:
        raise CublasLtError("torch has not loaded libcublasLt")
    lib = ctypes.CDLL(path)
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.cublasLtGetVersion.restype = sz
    lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int,
                                               ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, ctypes.c_int,
                                                   ctypes.POINTER(_HeuristicResult),
                                                   ctypes.POINTER(ctypes.c_int)]
    lib.cublasLtMatmulAlgoCheck.argtypes = [vp, vp, vp, vp, vp, vp, ctypes.POINTER(_Algo),
                                            ctypes.POINTER(_HeuristicResult)]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp,
                                   ctypes.POINTER(_Algo), vp, sz, vp]
    for name in ("cublasLtMatmulDescDestroy", "cublasLtMatrixLayoutDestroy",
                 "cublasLtMatmulPreferenceDestroy"):
        getattr(lib, name).argtypes = [vp]
    return lib


def version() -> int:
    """The version of the cuBLASLt torch has loaded (major * 10000 + minor * 100 + patch)."""
    return int(_library().cublasLtGetVersion())


@functools.cache
def _handle(device_index: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    with torch.cuda.device(device_index):
        _check(_library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    return handle


@functools.cache
def _workspace(device_index: int) -> torch.Tensor:
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=f"cuda:{device_index}")


def alignment(t: torch.Tensor) -> int:
    """The largest power of two up to 256 that divides t's address in bytes."""
    address = t.data_ptr()
    return 256 if address % 256 == 0 else address & -address


_ONE = ctypes.c_float(1.0)
_ZERO = ctypes.c_float(0.0)


class MatmulPlan:
    """cuBLASLt's descriptors of ``y [m, n] = x [m, k] W [n, k]^T (+ b)`` for one dtype."""

    def __init__(self, m: int, n: int, k: int, dtype: torch.dtype, bias: bool,
                 device_index: int):
        if dtype not in _DATA_TYPES:
            raise ValueError(f"cuBLASLt plan for {dtype} is not supported")
        lib = _library()
        self.device_index = device_index
        self._lib = lib
        self._desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self._desc), _COMPUTE_32F, _CUDA_R_32F),
               "cublasLtMatmulDescCreate")
        self._set(self._desc, _DESC_TRANSA, ctypes.c_int32(_OP_T))
        self._set(self._desc, _DESC_TRANSB, ctypes.c_int32(_OP_N))
        if bias:
            self._set(self._desc, _DESC_EPILOGUE, ctypes.c_int32(_EPILOGUE_BIAS))
        data_type = _DATA_TYPES[dtype]
        self._layouts = [self._layout(data_type, rows, cols)
                         for rows, cols in ((k, n), (k, m), (n, m))]  # W, x, y

    def candidates(self, aligns: tuple[int, int, int]) -> list[bytes]:
        """cuBLASLt's heuristic candidates for this shape and pointer alignments (weight, x,
        out), each workspace limit's best first, without repeats: opaque algorithm records for
        ``run``."""
        found: list[bytes] = []
        for limit in WORKSPACE_LIMITS:  # each limit's heuristic ranks its own candidates
            for result in self._heuristic(limit, aligns):
                algo = bytes(result.algo)
                if algo not in found:
                    found.append(algo)
        return found

    def supports(self, algo: bytes) -> bool:
        """Whether ``algo`` (a candidate of a plan of the same n, k, dtype and bias, possibly
        for other rows) can run this plan's shape within the workspace."""
        result = _HeuristicResult()
        w, x, y = self._layouts
        status = self._lib.cublasLtMatmulAlgoCheck(
            _handle(self.device_index), self._desc, w, x, y, y,
            ctypes.byref(_Algo.from_buffer_copy(algo)), ctypes.byref(result))
        return status == _STATUS_SUCCESS and result.workspace_size <= WORKSPACE_BYTES

    def _heuristic(self, workspace: int, aligns) -> list[_HeuristicResult]:
        lib = self._lib
        w, x, y = self._layouts
        preference = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)),
               "cublasLtMatmulPreferenceCreate")
        try:
            values = [(_PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(workspace))]
            values += [(_PREF_MIN_ALIGNMENT[name], ctypes.c_uint32(align))
                       for name, align in zip("abcd", (*aligns, aligns[2]))]
            for attribute, value in values:
                _check(lib.cublasLtMatmulPreferenceSetAttribute(
                    preference, attribute, ctypes.byref(value), ctypes.sizeof(value)),
                    "cublasLtMatmulPreferenceSetAttribute")
            results = (_HeuristicResult * MAX_CANDIDATES)()
            count = ctypes.c_int()
            _check(lib.cublasLtMatmulAlgoGetHeuristic(
                _handle(self.device_index), self._desc, w, x, y, y, preference, MAX_CANDIDATES,
                results, ctypes.byref(count)), "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(preference)
        return [results[i] for i in range(count.value) if results[i].state == _STATUS_SUCCESS]

    def _set(self, desc, attribute: int, value) -> None:
        _check(self._lib.cublasLtMatmulDescSetAttribute(desc, attribute, ctypes.byref(value),
                                                        ctypes.sizeof(value)),
               "cublasLtMatmulDescSetAttribute")

    def _layout(self, data_type: int, rows: int, cols: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _check(self._lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), data_type, rows, cols,
                                                    rows), "cublasLtMatrixLayoutCreate")
        return layout

    def run(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            out: torch.Tensor, algo: bytes) -> torch.Tensor:
        """out <- x W^T (+ bias) by the algorithm ``algo`` (from ``candidates``), on the current
        stream; the tensors are contiguous, of the plan's shape and dtype."""
        if bias is not None:
            self._set(self._desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        w, xl, y = self._layouts
        stream = torch.cuda.current_stream(self.device_index).cuda_stream
        _check(self._lib.cublasLtMatmul(
            _handle(self.device_index), self._desc, ctypes.byref(_ONE), weight.data_ptr(), w,
            x.data_ptr(), xl, ctypes.byref(_ZERO), out.data_ptr(), y, out.data_ptr(), y,
            ctypes.byref(_Algo.from_buffer_copy(algo)), _workspace(self.device_index).data_ptr(),
            WORKSPACE_BYTES, stream), "cublasLtMatmul")
        return out

    def __del__(self):
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        for layout in getattr(self, "_layouts", ()):
            lib.cublasLtMatrixLayoutDestroy(layout)
        if getattr(self, "_desc", None) is not None:
            lib.cublasLtMatmulDescDestroy(self._desc)


def aligns_of(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> tuple[int, int, int]:
    """The pointer alignments a candidate list is for: (weight, x, out)."""
    return alignment(weight), alignment(x), alignment(out)
