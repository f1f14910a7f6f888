"""Where the Triton kernel tests run: ``DEVICES`` parametrizes a case over the CPU through
Triton's interpreter (with TRITON_INTERPRET=1; tests/test_triton_interpreter.py runs such files
in a child pytest that sets it) and CUDA with compiled kernels (marked gpu); ``HOPPER`` is the
target that tests without a GPU compile for, through the ptxas in Triton's wheel."""
import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cpu", id="interpreter", marks=pytest.mark.skipif(
        not (HAS_TRITON and INTERPRET), reason="needs triton and TRITON_INTERPRET=1")),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not (HAS_TRITON and torch.cuda.is_available()) or INTERPRET,
        reason="needs CUDA and triton, kernels compiled (no TRITON_INTERPRET)")]),
]

HOPPER = ("cuda", 90, 32)  # a Triton GPUTarget's fields: sm_90, warps of 32 threads


def skip_without_ptxas() -> None:
    """Skip the calling test unless Triton finds a ptxas for ``HOPPER``."""
    from triton.backends.nvidia.compiler import get_ptxas
    try:
        get_ptxas(HOPPER[1])
    except RuntimeError as exc:
        pytest.skip(f"no ptxas: {exc}")
