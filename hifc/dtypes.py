"""Element types by name: the one list of dtypes the engine, the tiers and the CLI accept.

Torch-free at import: ``torch_dtype`` and ``dtype_name`` import torch when called, so the core,
the allocator and the configs can use the names without torch.
"""
from __future__ import annotations

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
NAMES = tuple(ITEMSIZE)
ALIASES = {"half": "float16", "float": "float32"}  # vLLM's (and torch's) other names


def canonical(name: str) -> str:
    """The dtype's name in ``NAMES`` for one of its aliases; other names unchanged."""
    return ALIASES.get(name, name)


def torch_dtype(name: str):
    """The torch dtype called ``name`` (one of ``NAMES``)."""
    import torch
    table = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype must be one of {', '.join(NAMES)}, got {name!r}")
    return table[name]


def dtype_name(dtype) -> str:
    """The name of a torch dtype (``torch.bfloat16`` -> ``"bfloat16"``)."""
    name = str(dtype).removeprefix("torch.")
    if name not in ITEMSIZE:
        raise ValueError(f"unsupported dtype {dtype}; supported: {', '.join(NAMES)}")
    return name
