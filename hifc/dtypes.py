"""Element types by name: the one list of dtypes the engine, the tiers and the CLI accept.

``NAMES`` are the compute dtypes (weights, activations, and a KV cache by default); a KV cache
may also hold ``FP8_E4M3`` (``torch.float8_e4m3fn``: 1 byte, 4 exponent and 3 mantissa bits,
finite range +-448, no infinities), quantised with per-layer or per-head scales.

Torch-free at import: ``torch_dtype``, ``dtype_name`` and ``copy_dtype`` import torch when
called, so the core, the allocator and the configs can use the names without torch.
"""
from __future__ import annotations

FP8_E4M3 = "float8_e4m3fn"
FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value
COMPUTE_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
NAMES = tuple(COMPUTE_ITEMSIZE)  # compute dtypes
ITEMSIZE = {**COMPUTE_ITEMSIZE, FP8_E4M3: 1}  # every dtype a KV cache may hold
KV_NAMES = tuple(ITEMSIZE)
ALIASES = {"half": "float16", "float": "float32"}  # vLLM's (and torch's) other names


def canonical(name: str) -> str:
    """The dtype's name in ``NAMES`` for one of its aliases; other names unchanged."""
    return ALIASES.get(name, name)


def is_fp8(name: str) -> bool:
    """Whether a KV cache of dtype ``name`` is quantised (holds scaled float8 values)."""
    return name == FP8_E4M3


def torch_dtype(name: str):
    """The torch dtype called ``name`` (one of ``KV_NAMES``)."""
    import torch
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
             FP8_E4M3: torch.float8_e4m3fn}
    if name not in table:
        raise ValueError(f"dtype must be one of {', '.join(KV_NAMES)}, got {name!r}")
    return table[name]


def dtype_name(dtype) -> str:
    """The name of a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``)."""
    name = str(dtype).removeprefix("torch.")
    if name not in ITEMSIZE:
        raise ValueError(f"unsupported dtype {dtype}; supported: {', '.join(KV_NAMES)}")
    return name


def copy_dtype(name: str):
    """The torch dtype that code moving elements of ``name`` without arithmetic (swaps,
    gathers, scatters) views them as: the dtype itself, or ``torch.uint8`` for float8, whose
    index kernels torch lacks on the CPU (the same bytes either way)."""
    import torch
    return torch.uint8 if is_fp8(name) else torch_dtype(name)
