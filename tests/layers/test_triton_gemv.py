"""The Triton GEMV for one-row projections against F.linear in float32.

Each case runs on the CPU through Triton's interpreter (with TRITON_INTERPRET=1; the default suite
runs this file's interpreter cases in a child pytest, tests/test_triton_interpreter.py) and
compiled on CUDA (marked gpu). The kernel's PTX for Hopper is checked on any machine.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from hifc.layers import linear as linear_module
from hifc.layers import triton_gemv
from hifc.layers.linear import RowLinear
from tests.layers.test_triton_fused import DEVICES

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,k,bias", [(40, 1024, False), (6144, 4096, False), (72, 1536, True)])
def test_gemv_matches_float32_linear(device, dtype, n, k, bias):
    # N not a multiple of the program's rows (40, 72) masks the last program's rows.
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dtype).to(device)
    b = torch.randn(n, generator=gen).to(dtype).to(device) if bias else None
    out = triton_gemv.gemv(x, w, b)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert out.shape == (1, n) and out.dtype == dtype
    # one rounding of the float32 sum to the 16-bit dtype
    tol = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    assert torch.allclose(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_usable_only_for_one_16_bit_row_on_cuda():
    w = torch.empty(64, 1024, dtype=torch.bfloat16)
    x = torch.empty(1, 1024, dtype=torch.bfloat16)
    assert not triton_gemv.usable(x, w)  # CPU tensors
    meta = torch.device("meta")
    cuda_like = {"is_cuda": True}

    class Fake:
        """Tensor attributes as a CUDA tensor of the given shape and dtype shows them."""

        def __init__(self, t):
            self.t = t

        def __getattr__(self, name):
            return cuda_like.get(name, getattr(self.t, name))

    def ok(m, k, dtype=torch.bfloat16, w_dtype=None):
        xs = Fake(torch.empty(m, k, dtype=dtype, device=meta))
        ws = Fake(torch.empty(64, k, dtype=w_dtype or dtype, device=meta))
        return triton_gemv.usable(xs, ws)

    if not HAS_TRITON:
        assert not ok(1, 1024)
        return
    assert ok(1, 1024) and ok(1, 4096, torch.float16)
    assert not ok(2, 1024)  # more than one row: cuBLAS
    assert not ok(1, 1000)  # K not a multiple of BLOCK_K
    assert not ok(1, 1024, torch.float32)
    assert not ok(1, 1024, torch.bfloat16, torch.float16)


def test_row_linear_takes_the_gemv_for_one_row(monkeypatch):
    # Linear layers route through linear(): a usable row goes to the GEMV, others to F.linear.
    calls = []
    monkeypatch.setattr(linear_module.triton_gemv, "usable", lambda x, w: x.shape[0] == 1)
    monkeypatch.setattr(linear_module.triton_gemv, "gemv",
                        lambda x, w, b: calls.append(x.shape) or F.linear(x, w, b))
    layer = RowLinear(32, 8, True, torch.float32, torch.device("cpu"))
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    x = torch.randn(3, 32)
    assert torch.equal(layer(x[:1]), F.linear(x[:1], layer.weight, layer.bias))
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert calls == [torch.Size([1, 32])]


@pytest.mark.skipif(not HAS_TRITON or INTERPRET, reason="needs triton, kernels compiled")
def test_gemv_compiles_to_wide_loads_for_hopper():
    from tests.layers.test_triton_compile_fp8 import compile_ptx

    signature = {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16",
                 "N": "i32", "stride_wn": "i32"}
    ptx = compile_ptx(triton_gemv._gemv_kernel, signature,
                      dict(K_STEPS=8, BLOCK_N=triton_gemv.BLOCK_N, BLOCK_K=triton_gemv.BLOCK_K,
                           STAGES=triton_gemv.NUM_STAGES, HAS_BIAS=False),
                      triton_gemv.NUM_WARPS)
    assert "cp.async" in ptx  # weight slices loaded ahead of their use (pipelined)
    assert "mma" not in ptx  # no tensor cores for one row
