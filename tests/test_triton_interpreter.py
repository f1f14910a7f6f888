"""The Triton kernels' CPU cases (attention, KV write, fused norm/SiLU/rotary, sampling
penalties, padded decode through Triton) in a child pytest with TRITON_INTERPRET=1, so that the
default suite runs them (~2 minutes on 2 cores). Cases that need a real GPU skip there.

The variable must be set before triton is imported, and it would make every Triton test of this
process interpret, so the cases run in their own process."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FILES = ["tests/layers/test_triton_attention.py", "tests/layers/test_triton_fused.py",
         "tests/layers/test_triton_penalties.py",
         "tests/runtime/test_decode_graphs_triton.py"]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available(),
                    reason="the cases run directly here")
def test_triton_kernels_in_the_interpreter():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *FILES], cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-2000:]
